#include "wk_fault.h"

#include <sq.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FAULTS 8

static const char *const point_names[] = {"load", "profile", "run", "refuse", "precision"};
#define NPOINTS ((int)(sizeof(point_names) / sizeof(point_names[0])))

static struct {
    int point;
    char sha[65];
} faults[MAX_FAULTS];
static int nfaults;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void parse(void)
{
    const char *env = getenv("SQUISH_WORKER_FAULT");
    if (env == NULL || *env == '\0')
        return;
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", env);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL && nfaults < MAX_FAULTS;
         tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        if (colon == NULL || strlen(colon + 1) < 8 || strlen(colon + 1) > 64)
            continue;
        *colon = '\0';
        for (int p = 0; p < NPOINTS; p++) {
            if (strcmp(tok, point_names[p]) == 0) {
                faults[nfaults].point = p;
                snprintf(faults[nfaults].sha, sizeof(faults[nfaults].sha), "%s", colon + 1);
                nfaults++;
            }
        }
    }
    if (nfaults > 0)
        SQ_WARN("fault injection armed faults=%d (SQUISH_WORKER_FAULT)", nfaults);
}

int wk_fault_check(wk_fault_point_t point, const char *sha256)
{
    pthread_once(&once, parse);
    if (sha256 == NULL)
        return 0;
    for (int i = 0; i < nfaults; i++) {
        if (faults[i].point == (int)point &&
            strncmp(sha256, faults[i].sha, strlen(faults[i].sha)) == 0) {
            if (point == WK_FAULT_REFUSE) {
                SQ_WARN("injected fault: refusing sha256=%.12s", sha256);
                return 1;
            }
            if (point == WK_FAULT_PRECISION) {
                SQ_WARN("injected fault: the plan taken to run the precision asked sha256=%.12s",
                        sha256);
                return 1;
            }
            SQ_WARN("injected fault: crashing point=%s sha256=%.12s", point_names[point], sha256);
            raise(SIGSEGV);
        }
    }
    return 0;
}
