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
    struct sigaction action;
    sigset_t none;
    int sig, tty;

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

#endif
