/* The listening socket of bench/relay_floor.c and bench/engine_floor.c: 127.0.0.1:PORT, backlog
 * 4096 (a burst of 1024 connections must not overflow it), registered for EPOLLIN on a new epoll
 * instance. Returns the listening fd and sets *epfd, or -1 after perror(who). */
#ifndef FLOOR_LISTEN_H
#define FLOOR_LISTEN_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>

static int floor_listen(int port, int sock_flags, int *epfd, const char *who) {
    int lfd = socket(AF_INET, SOCK_STREAM | sock_flags, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 4096) < 0) {
        perror(who);
        return -1;
    }
    *epfd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(*epfd, EPOLL_CTL_ADD, lfd, &ev);
    return lfd;
}

#endif
