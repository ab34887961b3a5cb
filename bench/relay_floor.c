/* The floor under any forwarder of streamed events (issue 24), for bench/relay_floor.py.
 *
 * A byte relay and nothing else: it accepts on 127.0.0.1:LISTEN, opens one connection to
 * 127.0.0.1:UPSTREAM per client, and copies bytes both ways as they arrive (one recv, one send,
 * no parsing, no buffering beyond one read, no logging). Whatever CPU it spends per streamed event
 * is what the kernel and one epoll loop cost on this machine; a proxy that does anything more
 * (HTTP, envelopes, signatures) cannot spend less. It stops by itself after IDLE seconds without a
 * connection, or on SIGTERM.
 *
 *   relay_floor LISTEN UPSTREAM [IDLE]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "floor_listen.h"

#define MAX_FDS 65536
#define CHUNK 65536

static int peer[MAX_FDS];  /* fd -> the fd its bytes go to; -1 when closed */
static volatile sig_atomic_t stopping = 0;

static void on_term(int sig) { (void)sig; stopping = 1; }

static void close_pair(int epfd, int fd) {
    int other = peer[fd];
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    peer[fd] = -1;
    if (other >= 0 && other < MAX_FDS && peer[other] == fd) {
        epoll_ctl(epfd, EPOLL_CTL_DEL, other, NULL);
        close(other);
        peer[other] = -1;
    }
}

/* Send all of buf on a blocking socket (loopback: a short stall at worst, never lost bytes). */
static int send_all(int fd, const char *buf, ssize_t len) {
    while (len > 0) {
        ssize_t n = send(fd, buf, (size_t)len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += n;
        len -= n;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: relay_floor LISTEN UPSTREAM [IDLE]\n");
        return 2;
    }
    int listen_port = atoi(argv[1]), upstream_port = atoi(argv[2]);
    int idle_limit = argc > 3 ? atoi(argv[3]) : 600;
    signal(SIGTERM, on_term);
    for (int i = 0; i < MAX_FDS; i++) peer[i] = -1;

    int epfd, one = 1;
    int lfd = floor_listen(listen_port, 0, &epfd, "relay_floor: bind/listen");
    if (lfd < 0) return 1;
    printf("relay_floor: listening on 127.0.0.1:%d -> 127.0.0.1:%d\n", listen_port, upstream_port);
    fflush(stdout);

    static char buf[CHUNK];
    struct epoll_event events[256];
    int open_pairs = 0, idle_ms = 0;
    while (!stopping) {
        int n = epoll_wait(epfd, events, 256, 100);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("relay_floor: epoll_wait");
            return 1;
        }
        if (n == 0) {
            idle_ms = open_pairs ? 0 : idle_ms + 100;
            if (idle_ms >= idle_limit * 1000) break;
            continue;
        }
        idle_ms = 0;
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                int cfd = accept(lfd, NULL, NULL);
                if (cfd < 0 || cfd >= MAX_FDS) { if (cfd >= 0) close(cfd); continue; }
                int ufd = socket(AF_INET, SOCK_STREAM, 0);
                struct sockaddr_in up = {.sin_family = AF_INET, .sin_port = htons((uint16_t)upstream_port)};
                up.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                if (ufd < 0 || ufd >= MAX_FDS || connect(ufd, (struct sockaddr *)&up, sizeof up) < 0) {
                    close(cfd);
                    if (ufd >= 0) close(ufd);
                    continue;
                }
                setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                setsockopt(ufd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                peer[cfd] = ufd;
                peer[ufd] = cfd;
                struct epoll_event ce = {.events = EPOLLIN, .data.fd = cfd};
                struct epoll_event ue = {.events = EPOLLIN, .data.fd = ufd};
                epoll_ctl(epfd, EPOLL_CTL_ADD, cfd, &ce);
                epoll_ctl(epfd, EPOLL_CTL_ADD, ufd, &ue);
                open_pairs++;
                continue;
            }
            if (peer[fd] < 0) continue;
            ssize_t got = recv(fd, buf, CHUNK, MSG_DONTWAIT);
            if (got > 0) {
                if (send_all(peer[fd], buf, got) < 0) { close_pair(epfd, fd); open_pairs--; }
            } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
                close_pair(epfd, fd);
                open_pairs--;
            }
        }
    }
    return 0;
}
