/* The pod sandbox ("pause") image's only program: sleeps until SIGINT or SIGTERM, reaps children.
 * Built static by scripts/build-images.sh (gcc -static) into monarch-spmd.local/pause. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
  signal(SIGINT, stop);
  signal(SIGTERM, stop);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
