/* What the modeldb tests of models.c, plans.c and the precision records
 * share: the database each test opens (sqlite, or PostgreSQL for the _pg
 * runs), its setup and teardown, and the SQL that undoes migration 7. */
#ifndef MDB_MODELS_TEST_H
#define MDB_MODELS_TEST_H

#include "mdb_test_db.h"

#include <criterion/criterion.h>
#include <mdb.h>

static test_db_t t;
static mdb_t *db;

static inline void setup(void)
{
    test_db_make(&t);
    cr_assert_eq(mdb_open(t.target, &db), 0, "%s", mdb_errmsg(db));
}

static inline void teardown(void)
{
    mdb_close(db);
    db = NULL;
    test_db_drop(&t);
}

/* SQL that takes a database of this schema back to schema 6, whose models
 * row held its file (migrations 8 and 7 undone: a file's later pieces are
 * dropped, as the files stored before schema 8 have none). */
static inline const char *undo_model_files(void)
{
    return t.pg ? "ALTER TABLE models ADD COLUMN onnx BYTEA;"
                  "UPDATE models SET onnx = (SELECT onnx FROM model_files f "
                  "WHERE f.model_id = models.id);"
                  "DROP TABLE model_files; DROP TABLE model_not_on; DROP TABLE decode_costs;"
                  "DROP TABLE model_file_chunks;"
                : "ALTER TABLE models ADD COLUMN onnx BLOB;"
                  "UPDATE models SET onnx = (SELECT onnx FROM model_files f "
                  "WHERE f.model_id = models.id);"
                  "DROP TABLE model_files; DROP TABLE model_not_on; DROP TABLE decode_costs;"
                  "DROP TABLE model_file_chunks;";
}

#endif
