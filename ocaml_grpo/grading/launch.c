/* The sandbox's launcher (ocaml_grpo/grading/sandbox.py builds it with `cc` on first use): the
   last step before a toolchain call or a test program runs, inside bubblewrap. One exec instead of
   three (`prlimit`, `setpriv`, `nice`: ~2.5 ms of CPU per run), and one binary in the run sandbox
   instead of three.

     launch CPU_S AS_BYTES FSIZE_BYTES NOFILE NPROC UID NICE -- PROGRAM [ARG...]

   Sets the rlimits (soft = hard; no core files), then, when UID is not "-": the process limit, no supplementary
   groups, gid and uid UID (real, effective and saved); then no_new_privs and the nice value (at
   least NICE: a higher one it inherited is kept; 0: unchanged), and execs PROGRAM (searched on
   PATH when it has no slash). Any failure is a message on stderr and exit status 127, before
   PROGRAM runs.

     launch --serve CONTROL_FD

   The prepared model-code sandbox (sandbox.py's PreparedSandbox): started once inside bubblewrap,
   as root, it starts each run as a fresh child, so that a run costs a fork and three namespaces
   instead of a whole bubblewrap. Each request on the control socket (SOCK_SEQPACKET) is one
   message: NUL-separated fields WORK_BYTES TMP_BYTES HOW K TARGET_1..TARGET_K, then the launcher's
   arguments above; with descriptors [run socket, program, fd_1..fd_K]. For each, a manager
   process: new mount, IPC and PID namespaces; fresh tmpfs /work (WORK_BYTES) and /tmp (TMP_BYTES);
   then the run, PID 1 of its namespace (so everything it starts dies with it), with fd_i at
   TARGET_i and no other descriptor, launched as above in /work. HOW is "copy" (the program is
   copied in as /work/prog, e.g. bytecode, whose #! needs a path) or "exec" (a native executable:
   executed from its descriptor, never copied).
   On the run socket: "started" (or "error MESSAGE"), then "exit WAIT_STATUS CPU_MICROSECONDS" once
   it ended; a message or the end of the socket from the grader kills it first. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static int exec_fd = -1;  /* the prepared sandbox's run of a native program: executed from here */

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

static int launch(int argc, char **argv) {
  if (argc < 10 || strcmp(argv[8], "--") != 0) {
    fprintf(stderr, "usage: launch CPU_S AS_BYTES FSIZE_BYTES NOFILE NPROC UID NICE -- PROGRAM [ARG...]\n");
    return 127;
  }
  limit(RLIMIT_CPU, argv[1], "cpu limit");
  limit(RLIMIT_CORE, "0", "core file limit");
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
  if (nice_value != 0) {
    /* At least NICE: a grader started under `nice -n 19` keeps 19. Lowering it would need a
       privilege the job's uid does not have, and every run would fail. */
    errno = 0;
    int current = getpriority(PRIO_PROCESS, 0);
    if (current == -1 && errno != 0) fail("getpriority");
    if (nice_value > current && setpriority(PRIO_PROCESS, 0, (int)nice_value) != 0) fail("setpriority");
  }
  if (exec_fd >= 0) {
    syscall(SYS_execveat, exec_fd, "", argv + 9, environ, AT_EMPTY_PATH);
    fail(argv[9]);
  }
  execvp(argv[9], argv + 9);
  if (errno == EACCES && program >= 0) syscall(SYS_execveat, program, "", argv + 9, environ, AT_EMPTY_PATH);
  fail(argv[9]);
  return 127;
}

/* ---- the prepared sandbox ---- */

#define REQUEST_MAX 65536
#define MAX_FDS 16
#define MAX_FIELDS 4096

/* A message to the grader on the run socket (its failure is the grader's to notice: the socket's end). */
static void say(int sock, const char *text) { (void)send(sock, text, strlen(text), MSG_NOSIGNAL); }

static void refuse(int sock, const char *what) {
  char text[512];
  snprintf(text, sizeof text, "error %s: %s", what, strerror(errno));
  say(sock, text);
  _exit(1);
}

/* Close every descriptor from `from` up that is not one of the k targets (sorted here). */
static void close_all_but(int from, int *targets, int k) {
  for (int i = 1; i < k; i++)
    for (int j = i; j > 0 && targets[j - 1] > targets[j]; j--) {
      int t = targets[j]; targets[j] = targets[j - 1]; targets[j - 1] = t;
    }
  int low = from;
  for (int i = 0; i < k; i++) {
    if (targets[i] > low) syscall(SYS_close_range, low, targets[i] - 1, 0);
    if (targets[i] + 1 > low) low = targets[i] + 1;
  }
  syscall(SYS_close_range, low, ~0U, 0);
}

static void fresh_tmpfs(int sock, const char *where, long long bytes, const char *mode) {
  char options[64];
  snprintf(options, sizeof options, "size=%lld,mode=%s", bytes, mode);
  if (mount("tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV, options) != 0) refuse(sock, where);
}

static void copy_program(int sock, int program) {
  int out = open("/work/prog", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
  if (out < 0 || fchmod(out, 0755) != 0) refuse(sock, "/work/prog");
  char chunk[65536];
  ssize_t n;
  while ((n = read(program, chunk, sizeof chunk)) > 0)
    for (ssize_t done = 0; done < n;) {
      ssize_t w = write(out, chunk + done, n - done);
      if (w < 0) refuse(sock, "writing /work/prog");
      done += w;
    }
  if (n < 0 || close(out) != 0) refuse(sock, "copying the program");
}

static void manage(char *request, size_t size, int *fds, int nfds) {
  int sock = fds[0], program = fds[1];
  static char *field[MAX_FIELDS + 1];
  int nfield = 0;
  for (size_t at = 0; at < size && nfield < MAX_FIELDS; at += strlen(request + at) + 1) field[nfield++] = request + at;
  if (nfield < 4 || nfield == MAX_FIELDS) { errno = EINVAL; refuse(sock, "request"); }
  long long work_bytes = number(field[0], "work size"), tmp_bytes = number(field[1], "tmp size");
  int copy = strcmp(field[2], "copy") == 0;
  if (!copy && strcmp(field[2], "exec") != 0) { errno = EINVAL; refuse(sock, "request"); }
  int k = (int)number(field[3], "descriptor count");
  if (k != nfds - 2 || nfield < 4 + k + 9) { errno = EINVAL; refuse(sock, "request"); }
  int targets[MAX_FDS];
  for (int i = 0; i < k; i++) targets[i] = (int)number(field[4 + i], "descriptor");
  char **args = field + 4 + k - 1;  /* the launcher's arguments, with a slot for argv[0] */
  int nargs = nfield - (4 + k) + 1;
  args[nargs] = NULL;

  if (unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID) != 0) refuse(sock, "unshare");
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) refuse(sock, "private mounts");
  fresh_tmpfs(sock, "/work", work_bytes, "0777");
  fresh_tmpfs(sock, "/tmp", tmp_bytes, "1777");
  if (copy) {
    copy_program(sock, program);
    close(program);
  }

  pid_t run = fork();
  if (run < 0) refuse(sock, "fork");
  if (run == 0) {
    /* PID 1 of the new namespace. The descriptors (and a native program's) are first staged
       above every target, since a target may be the number one of them arrived at; then each goes
       to its target (dup2 onto the same number would keep close-on-exec). */
    int top = 2;
    for (int i = 0; i < k; i++) if (targets[i] > top) top = targets[i];
    int staged[MAX_FDS];
    for (int i = 0; i < k; i++)
      if ((staged[i] = fcntl(fds[2 + i], F_DUPFD_CLOEXEC, top + 1)) < 0) fail("descriptor");
    if (!copy && (exec_fd = fcntl(program, F_DUPFD_CLOEXEC, top + 1)) < 0) fail("descriptor");
    for (int i = 0; i < k; i++)
      if (dup2(staged[i], targets[i]) < 0) fail("descriptor");
    if (!copy) targets[k++] = exec_fd;  /* kept until the exec, which closes it */
    close_all_but(3, targets, k);
    if (chdir("/work") != 0) fail("/work");
    args[0] = "launch";
    _exit(launch(nargs, args));
  }
  for (int i = 2; i < nfds; i++) close(fds[i]);
  if (!copy) close(program);
  say(sock, "started");
  int exited = (int)syscall(SYS_pidfd_open, run, 0);
  if (exited < 0) { kill(run, SIGKILL); refuse(sock, "pidfd_open"); }
  struct pollfd watch[2] = {{exited, POLLIN, 0}, {sock, POLLIN, 0}};
  for (;;) {
    if (poll(watch, 2, -1) < 0 && errno != EINTR) { kill(run, SIGKILL); break; }
    if (watch[0].revents) break;
    if (watch[1].revents) { kill(run, SIGKILL); watch[1].fd = -1; }  /* asked to stop, or the grader is gone */
  }
  int status;
  struct rusage usage;
  if (wait4(run, &status, 0, &usage) < 0) refuse(sock, "wait4");
  long long cpu_us = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000LL
                     + usage.ru_utime.tv_usec + usage.ru_stime.tv_usec;
  char text[64];
  snprintf(text, sizeof text, "exit %d %lld", status, cpu_us);
  say(sock, text);
  _exit(0);
}

static int serve(int control) {
  struct sigaction reap = {0};
  reap.sa_handler = SIG_IGN;
  reap.sa_flags = SA_NOCLDWAIT;  /* managers need no waiting for */
  sigaction(SIGCHLD, &reap, NULL);
  static char request[REQUEST_MAX + 1];
  for (;;) {
    char control_data[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct iovec io = {request, REQUEST_MAX};
    struct msghdr msg = {0};
    msg.msg_iov = &io;
    msg.msg_iovlen = 1;
    msg.msg_control = control_data;
    msg.msg_controllen = sizeof control_data;
    ssize_t n = recvmsg(control, &msg, MSG_CMSG_CLOEXEC);
    if (n == 0) return 0;  /* the grader closed its end: done */
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("recvmsg");
    }
    int fds[MAX_FDS], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < count && nfds < MAX_FDS; i++) memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      }
    request[n] = '\0';
    /* A malformed request is dropped: its run socket closes, which the grader sees. */
    if (nfds >= 2 && !(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) && request[n - 1] == '\0') {
      pid_t manager = fork();
      if (manager == 0) {
        struct sigaction plain = {0};
        plain.sa_handler = SIG_DFL;
        sigaction(SIGCHLD, &plain, NULL);
        close(control);
        manage(request, (size_t)n, fds, nfds);
      }
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
  }
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--serve") == 0) return serve((int)number(argv[2], "control socket"));
  return launch(argc, argv);
}
