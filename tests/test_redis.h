/* test_redis.h - a redis-server for the tests that need one (test_tier, test_engine_tier):
 * started on a free 127.0.0.1 port as a child that dies with the test (even if it crashes),
 * no persistence; redis_binary_present says whether one can run here at all (the caller
 * skips, 77, when not). */
#ifndef KVC_TEST_REDIS_H
#define KVC_TEST_REDIS_H

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t redis_pid = -1;
static int redis_port;

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static redisContext *redis_admin(void)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

static bool redis_start(void)
{
    char port[16];
    snprintf(port, sizeof port, "%d", redis_port);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a crashed parent */
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--daemonize", "no", (char *)NULL);
        _exit(127);
    }
    redis_pid = pid;
    for (int i = 0; i < 200; i++) { /* up to 10 s */
        redisContext *c = redis_admin();
        if (c) {
            redisReply *r = redisCommand(c, "PING");
            bool ok = r && r->type == REDIS_REPLY_STATUS;
            if (r) freeReplyObject(r);
            redisFree(c);
            if (ok) return true;
        }
        int ws;
        if (waitpid(pid, &ws, WNOHANG) == pid) {
            redis_pid = -1;
            return false;
        }
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    return false;
}

static void redis_stop(void)
{
    if (redis_pid <= 0) return;
    kill(redis_pid, SIGCONT);
    kill(redis_pid, SIGKILL);
    waitpid(redis_pid, NULL, 0);
    redis_pid = -1;
}

static bool redis_binary_present(void)
{
    const char *path = getenv("PATH");
    if (!path) return false;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *dir = strtok(buf, ":"); dir; dir = strtok(NULL, ":")) {
        char f[4200];
        snprintf(f, sizeof f, "%s/redis-server", dir);
        if (access(f, X_OK) == 0) return true;
    }
    return false;
}

#endif /* KVC_TEST_REDIS_H */
