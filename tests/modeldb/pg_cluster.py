#!/usr/bin/python3
"""Runs a test program against a private PostgreSQL cluster: initdb in a
temporary directory, a server that listens only on a unix socket in that
directory (no TCP), a database "squish", the program with SQUISH_TEST_PG set
to its conninfo, and the cluster stopped and removed afterwards, whatever
happened. As root (CI) the server runs as the postgres user, since
PostgreSQL refuses to run as root. Without PostgreSQL (scripts/bootstrap
installs postgresql-15) it prints a TAP plan that skips, saying why.

Usage: pg_cluster.py PROGRAM [ARGS...]
SQUISH_PG_BIN names the directory of initdb and pg_ctl when it is not
/usr/lib/postgresql/<version>/bin."""

import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile


def find_bindir():
    env = os.environ.get("SQUISH_PG_BIN")
    candidates = [env] if env else []
    # 15 first (the version bootstrap installs), else the newest installed.
    def version(d):
        v = d.split("/")[-2]
        return int(v) if v.isdigit() else 0

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda d: (version(d) != 15, -version(d)))
    for d in candidates:
        if os.path.isfile(os.path.join(d, "initdb")) and os.path.isfile(os.path.join(d, "pg_ctl")):
            return d
    return None


def skip(reason):
    print("1..0 # SKIP " + reason, flush=True)
    sys.exit(0)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: pg_cluster.py PROGRAM [ARGS...]")
    bindir = find_bindir()
    if bindir is None:
        skip("PostgreSQL is not installed (scripts/bootstrap installs postgresql-15)")

    as_user = []
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            skip("running as root and there is no postgres user to run the server as")
        as_user = ["runuser", "-u", "postgres", "--"]

    tmp = tempfile.mkdtemp(prefix="squish-pg-")
    if as_user:
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
    data = os.path.join(tmp, "data")
    log = os.path.join(tmp, "server.log")
    started = False

    # meson's timeout sends SIGTERM: stop the cluster on the way out.
    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def run(cmd, what):
        r = subprocess.run(as_user + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, cwd=tmp)
        if r.returncode != 0:
            sys.stderr.write(r.stdout)
            if os.path.exists(log):
                sys.stderr.write(open(log).read())
            print("Bail out! " + what + " failed (exit %d)" % r.returncode, flush=True)
            raise SystemExit(1)

    rc = 1
    try:
        run([os.path.join(bindir, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
             "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"], "initdb")
        # Throwaway data: no fsync; small memory, as two suites may run at once.
        opts = ("-c listen_addresses='' -c unix_socket_directories='%s' -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c shared_buffers=32MB "
                "-c max_connections=50" % tmp)
        started = True
        run([os.path.join(bindir, "pg_ctl"), "-D", data, "-l", log, "-w", "-t", "60",
             "-o", opts, "start"], "pg_ctl start")
        conninfo = "host=%s port=5432 user=postgres dbname=squish" % tmp
        run([os.path.join(bindir, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
             "host=%s port=5432 user=postgres dbname=postgres" % tmp,
             "-c", "CREATE DATABASE squish"], "createdb")
        env = dict(os.environ, SQUISH_TEST_PG=conninfo)
        rc = subprocess.run(sys.argv[1:], env=env).returncode
    finally:
        if started:
            subprocess.run(as_user + [os.path.join(bindir, "pg_ctl"), "-D", data, "-m",
                                      "immediate", "-w", "stop"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
