#ifndef GUIDEDACCESS_CPROCESS_SHIM_H
#define GUIDEDACCESS_CPROCESS_SHIM_H
/* Starting a helper program the way systemd's fork_agent() does, for
 * guidedaccessctl's polkit agent. In C because between fork and exec the
 * child may only make async-signal-safe calls, and Swift cannot call the
 * variadic prctl(). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* In a forked child: every signal's default disposition and an empty
 * signal mask (async-signal-safe). A thread of the parent may block nearly
 * every signal, and a blocked mask and ignored signals survive exec. */
static inline void ga_child_default_signals(void) {
    struct sigaction action;
    sigset_t none;
    int sig;
    for (sig = 1; sig < _NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        sigemptyset(&action.sa_mask);
        action.sa_flags = 0;
        action.sa_handler = SIG_DFL;
        (void) sigaction(sig, &action, NULL); /* EINVAL for libc's own signals */
    }
    sigemptyset(&none);
    (void) sigprocmask(SIG_SETMASK, &none, NULL);
}

/* Forks and runs `path` with `argv` and `envp`. The child gets:
 * - every signal's default disposition and an empty signal mask: a thread of
 *   the caller may block nearly every signal (libdispatch's workers, which
 *   run Swift's async code, block SIGTERM, SIGINT, SIGHUP, SIGTSTP, ...), and
 *   a blocked mask and ignored signals survive exec;
 * - SIGTERM when the calling *thread* ends (PR_SET_PDEATHSIG), so the caller
 *   should fork from a thread that lives until it has reaped the child;
 * - /dev/tty as stdout and stderr where those are not a terminal;
 * - `keep_fd` as descriptor 3, and no descriptors but 0, 1, 2 and 3.
 * Returns the child's pid, or -errno when fork fails. */
static inline pid_t ga_fork_agent(const char *path, char *const argv[], char *const envp[], int keep_fd) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid > 0)
        return pid;

    /* The child: async-signal-safe calls only. */
    int tty;

    ga_child_default_signals();

    if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0)
        _exit(127);
    if (getppid() != parent) /* the caller is already gone */
        _exit(0);

    if (!isatty(STDOUT_FILENO) || !isatty(STDERR_FILENO)) {
        tty = open("/dev/tty", O_WRONLY | O_NOCTTY | O_CLOEXEC);
        if (tty < 0)
            _exit(127);
        if (!isatty(STDOUT_FILENO) && dup2(tty, STDOUT_FILENO) < 0)
            _exit(127);
        if (!isatty(STDERR_FILENO) && dup2(tty, STDERR_FILENO) < 0)
            _exit(127);
    }

    if (keep_fd == 3) {
        if (fcntl(3, F_SETFD, 0) < 0)
            _exit(127);
    } else if (dup2(keep_fd, 3) < 0) { /* dup2 clears close-on-exec */
        _exit(127);
    }
#ifdef SYS_close_range
    (void) syscall(SYS_close_range, 4U, ~0U, 0U); /* the rest are close-on-exec anyway */
#endif

    execve(path, argv, envp);
    _exit(127);
}

#include <sys/socket.h>
#include <sys/wait.h>

/* Starts `path` as a program of the kiosk's session (the screen reader): in
 * a session of its own (so signals to the service's group never reach it),
 * every signal at its default and none blocked, stdin on /dev/null, stdout
 * and stderr on `output_fd` (the write end of a pipe the service reads, to
 * log what it writes as the program's) or, with -1, stdout on /dev/null and
 * stderr shared with the service; `hold_fd` (the pipe's read end, or -1) as
 * descriptor 3, so that a write never meets a pipe without a reader (no
 * SIGPIPE) once the service is gone; no other descriptor. Returns the pid
 * once exec has succeeded, or -errno of the failed step (an exec failure is
 * reported through a close-on-exec pipe). */
static inline pid_t ga_spawn_program(const char *path, char *const argv[], char *const envp[], int output_fd,
                                     int hold_fd) {
    int report[2];
    if (pipe2(report, O_CLOEXEC) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int error = errno;
        close(report[0]);
        close(report[1]);
        return -error;
    }
    if (pid == 0) {
        int null, error, out;
        ga_child_default_signals();
        if (setsid() < 0)
            goto failed;
        /* The report pipe above the descriptors placed below. */
        out = fcntl(report[1], F_DUPFD_CLOEXEC, 10);
        if (out < 0)
            goto failed;
        report[1] = out;
        null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null < 0 || dup2(null, STDIN_FILENO) < 0)
            goto failed;
        if (dup2(output_fd >= 0 ? output_fd : null, STDOUT_FILENO) < 0)
            goto failed;
        if (output_fd >= 0 && dup2(output_fd, STDERR_FILENO) < 0)
            goto failed;
        if (hold_fd == 3) {
            if (fcntl(3, F_SETFD, 0) < 0)
                goto failed;
        } else if (hold_fd >= 0 && dup2(hold_fd, 3) < 0) { /* dup2 clears close-on-exec */
            goto failed;
        }
#ifdef SYS_close_range
        /* Everything but 0-2, the held descriptor and the report pipe
         * (close-on-exec itself). */
        {
            unsigned first = hold_fd >= 0 ? 4U : 3U;
            if ((unsigned) report[1] > first)
                (void) syscall(SYS_close_range, first, (unsigned) report[1] - 1, 0U);
            (void) syscall(SYS_close_range, (unsigned) report[1] + 1, ~0U, 0U);
        }
#endif
        execve(path, argv, envp);
    failed:
        error = errno;
        (void) !write(report[1], &error, sizeof error);
        _exit(127);
    }
    close(report[1]);
    int error = 0;
    ssize_t n;
    do
        n = read(report[0], &error, sizeof error);
    while (n < 0 && errno == EINTR);
    close(report[0]);
    if (n == (ssize_t) sizeof error) {
        (void) waitpid(pid, NULL, 0);
        return -error;
    }
    return pid;
}

/* A pipe for a program's output: both ends close-on-exec and non-blocking
 * (a program writing into a full pipe gets EAGAIN, never blocks). */
static inline int ga_output_pipe(int fds[2]) {
    return pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0 ? -errno : 0;
}

/* A descriptor that refers to process `pid` and no later one with its pid;
 * readable once it has exited. -errno on failure. */
static inline int ga_pidfd_open(pid_t pid) {
    long fd = syscall(SYS_pidfd_open, pid, 0U);
    return fd < 0 ? -errno : (int) fd;
}

static inline int ga_pidfd_send_signal(int pidfd, int sig) {
    return syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0U) < 0 ? -errno : 0;
}

/* Reaps the child `pidfd` refers to if it has exited: its wait status
 * (as waitpid gives it), or -errno (ECHILD for a process that is not our
 * child, EAGAIN when it is still running). */
static inline int ga_pidfd_reap(int pidfd) {
    siginfo_t info;
    info.si_pid = 0;
    if (waitid((idtype_t) 3 /* P_PIDFD */, (id_t) pidfd, &info, WEXITED | WNOHANG) < 0)
        return -errno;
    if (info.si_pid == 0)
        return -EAGAIN;
    return info.si_code == CLD_EXITED ? (info.si_status & 0xff) << 8 : (info.si_status & 0x7f);
}

/* The pid of the process at the other end of a connected unix socket. */
static inline pid_t ga_socket_peer_pid(int fd) {
    /* struct ucred { pid_t pid; uid_t uid; gid_t gid; }, which glibc
     * declares only for _GNU_SOURCE. */
    int credentials[3];
    socklen_t size = sizeof credentials;
    if (getsockopt(fd, SOL_SOCKET, 17 /* SO_PEERCRED */, credentials, &size) < 0)
        return -errno;
    return (pid_t) credentials[0];
}

/* The uid of the process at the other end of a connected unix socket, or
 * (uid_t) -1. */
static inline uid_t ga_socket_peer_uid(int fd) {
    int credentials[3];
    socklen_t size = sizeof credentials;
    if (getsockopt(fd, SOL_SOCKET, 17 /* SO_PEERCRED */, credentials, &size) < 0)
        return (uid_t) -1;
    return (uid_t) credentials[1];
}

#endif
