/* The sandbox's launcher (ocaml_sandbox.py builds it with `cc` on first use): the last step
   before a toolchain call or a test program runs, inside bubblewrap. One exec instead of three
   (`prlimit`, `setpriv`, `nice`: ~2.5 ms of CPU per run), and one binary in the run sandbox
   instead of three.

     launch CPU_S AS_BYTES FSIZE_BYTES NOFILE NPROC UID NICE -- PROGRAM [ARG...]

   Sets the rlimits (soft = hard), then, when UID is not "-": the process limit, no supplementary
   groups, gid and uid UID (real, effective and saved); then no_new_privs and the nice value (0:
   unchanged), and execs PROGRAM (searched on PATH when it has no slash). Any failure is a message
   on stderr and exit status 127, before PROGRAM runs. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

static void fail(const char *what) {
  fprintf(stderr, "launch: %s: %s\n", what, strerror(errno));
  _exit(127);
}

static long long number(const char *text, const char *what) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno || *text == '\0' || *end != '\0' || v < 0) {
    fprintf(stderr, "launch: %s: not a number: %s\n", what, text);
    _exit(127);
  }
  return v;
}

static void limit(int resource, const char *text, const char *what) {
  struct rlimit r;
  r.rlim_cur = r.rlim_max = (rlim_t)number(text, what);
  if (setrlimit(resource, &r) != 0) fail(what);
}

int main(int argc, char **argv) {
  if (argc < 10 || strcmp(argv[8], "--") != 0) {
    fprintf(stderr, "usage: launch CPU_S AS_BYTES FSIZE_BYTES NOFILE NPROC UID NICE -- PROGRAM [ARG...]\n");
    return 127;
  }
  limit(RLIMIT_CPU, argv[1], "cpu limit");
  limit(RLIMIT_AS, argv[2], "address space limit");
  limit(RLIMIT_FSIZE, argv[3], "file size limit");
  limit(RLIMIT_NOFILE, argv[4], "open files limit");
  /* A program named by its path is found with the launcher's rights, as `setpriv` finds it: a
     tool of ours may live where the job's uid cannot look (under /root/.cache, with
     OCAML_SANDBOX=none); the uid still needs the right to execute the file itself. */
  int program = strchr(argv[9], '/') ? open(argv[9], O_PATH | O_CLOEXEC) : -1;
  if (strcmp(argv[6], "-") != 0) {
    /* RLIMIT_NPROC counts the processes of the uid, and not at all for root: set with the uid. */
    limit(RLIMIT_NPROC, argv[5], "process limit");
    uid_t uid = (uid_t)number(argv[6], "uid");
    if (setgroups(0, NULL) != 0) fail("setgroups");
    if (setresgid(uid, uid, uid) != 0) fail("setresgid");
    if (setresuid(uid, uid, uid) != 0) fail("setresuid");
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("no_new_privs");
  long long nice_value = number(argv[7], "nice");
  if (nice_value != 0 && setpriority(PRIO_PROCESS, 0, (int)nice_value) != 0) fail("setpriority");
  execvp(argv[9], argv + 9);
  if (errno == EACCES && program >= 0) syscall(SYS_execveat, program, "", argv + 9, environ, AT_EMPTY_PATH);
  fail(argv[9]);
  return 127;
}
