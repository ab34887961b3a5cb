/* An engine that costs the host almost nothing, for bench/relay_floor.py --engine c (issue 24).
 *
 * The vLLM stand-in is Python: at 256 streams it takes most of this machine's two cores itself, so
 * every millisecond a forwarder spends is taken from the engine, and "first token added" measures
 * that competition rather than the forwarder's queue. A GPU engine leaves the host's cores to the
 * worker. This one does too: one epoll loop in C that answers the OpenAI completion routes the way
 * the stand-in does (64 token events at 20 ms each, then the finish event and `data: [DONE]`,
 * each one its own chunk and its own send; a non-streamed answer after max_tokens token times),
 * keeps connections alive, answers GET /health, and appends vLLM's ready line to LOG once it
 * listens, so the worker's MODEL_LOG sees the model loaded. It parses only what it needs
 * (Content-Length, "stream": true, "max_tokens") and is not an engine for anything else.
 *
 *   engine_floor PORT LOG MODEL [TOKENS] [DELAY_MS] [IDLE]
 *
 * Loopback only. A client that stops reading (a send that would block) is cut and counted; the
 * count is printed when it stops: on SIGTERM, or by itself after IDLE seconds (default 120) with
 * no connection open.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "floor_listen.h"

#define MAX_FDS 8192
#define INBUF 65536

enum phase { READING, STREAMING, ANSWERING };

struct conn {
    int open;
    enum phase phase;
    char in[INBUF];
    size_t len;       /* bytes held in `in` */
    size_t used;      /* bytes of `in` the request being answered took */
    int close_after;  /* the request asked for Connection: close */
    int tokens;       /* tokens this answer has */
    int sent;         /* token events sent so far */
    double start;     /* when the answer began, ms */
    long serial;      /* this answer's number, for its id */
    time_t created;   /* when it began, seconds since the epoch */
};

static struct conn *conns[MAX_FDS];
static volatile sig_atomic_t stopping = 0;
static int tokens_full = 64;
static double delay_ms = 20.0;
static const char *model = "model";
static long cut = 0, answered = 0, answers_begun = 0;
static int top_fd = 0;  /* the highest connection fd seen: the scans stop there */

static void on_term(int sig) { (void)sig; stopping = 1; }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

static void drop(int epfd, int fd) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free(conns[fd]);
    conns[fd] = NULL;
}

/* One send of the whole buffer or the connection is cut: a loopback client that reads keeps up. */
static int put(int epfd, int fd, const char *buf, size_t len) {
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)len) return 0;
    if (n >= 0 || errno == EAGAIN || errno == EWOULDBLOCK) cut++;
    drop(epfd, fd);
    return -1;
}

/* One SSE event as one HTTP chunk, in one send. */
static int event(int epfd, int fd, const char *data) {
    char buf[1024];
    int body = snprintf(buf + 16, sizeof buf - 16, "data: %s\n\n", data);
    char head[16];
    int hl = snprintf(head, sizeof head, "%x\r\n", body);
    memcpy(buf + 16 - hl, head, (size_t)hl);
    memcpy(buf + 16 + body, "\r\n", 2);
    return put(epfd, fd, buf + 16 - hl, (size_t)(hl + body + 2));
}

/* The answer's id and time, as the stand-in writes them (cmpl-<32 hex>, seconds since the epoch). */
static void answer_id(struct conn *c, char out[40]) {
    snprintf(out, 40, "cmpl-%016lx%016lx", (unsigned long)c->serial, (unsigned long)c->start);
}

/* One token event, or the finish event when `finish` is given: the stand-in's keys, order and
 * separators, so that an event is as many bytes as the stand-in's. The finish event ends a stream
 * without a usage chunk, so it carries the fingerprint, as vLLM's does. */
static int token_event(int epfd, int fd, struct conn *c, int k, const char *finish) {
    char data[768], id[40];
    answer_id(c, id);
    snprintf(data, sizeof data,
             "{\"id\": \"%s\", \"object\": \"text_completion\", \"created\": %ld, \"model\": \"%s\", %s"
             "\"choices\": [{\"index\": 0, \"text\": \"%s\", \"logprobs\": null, \"finish_reason\": %s, "
             "\"prompt_token_ids\": null, \"stop_reason\": null, \"token_ids\": null}]}",
             id, (long)c->created, model, finish ? "\"system_fingerprint\": \"vllm-0.33.0+floor\", " : "",
             finish ? "" : (k % 2 ? " floor" : " tok"), finish ? finish : "null");
    return event(epfd, fd, data);
}

static int answer_json(int epfd, int fd, int status, const char *body) {
    char buf[2560];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nserver: uvicorn\r\ncontent-type: application/json\r\n"
                     "content-length: %zu\r\n\r\n%s",
                     status, status == 200 ? "OK" : "Not Found", strlen(body), body);
    return put(epfd, fd, buf, (size_t)n);
}

/* The request in c->in is done with: keep what came after it, read the next one. */
static void next_request(struct conn *c) {
    memmove(c->in, c->in + c->used, c->len - c->used);
    c->len -= c->used;
    c->used = 0;
    c->phase = READING;
}

static long number_after(const char *body, size_t len, const char *key) {
    const char *at = memmem(body, len, key, strlen(key));
    if (!at) return -1;
    at += strlen(key);
    while (at < body + len && (*at == ' ' || *at == ':')) at++;
    return (at < body + len && *at >= '0' && *at <= '9') ? strtol(at, NULL, 10) : -1;
}

/* Parse one whole request if it is in; start its answer. -1: the connection is gone. */
static int take_request(int epfd, int fd, struct conn *c) {
    char *end = memmem(c->in, c->len, "\r\n\r\n", 4);
    if (!end) {
        if (c->len == INBUF) { drop(epfd, fd); return -1; }
        return 0;
    }
    size_t head = (size_t)(end - c->in) + 4;
    long clen = 0;
    for (char *line = memchr(c->in, '\n', head); line && line < c->in + head; line = memchr(line, '\n', (size_t)(c->in + head - line))) {
        line++;
        if (strncasecmp(line, "content-length:", 15) == 0) clen = strtol(line + 15, NULL, 10);
        if (strncasecmp(line, "connection:", 11) == 0 && strncasecmp(line + 11, " close", 6) == 0) c->close_after = 1;
    }
    if (clen < 0 || head + (size_t)clen > INBUF) { drop(epfd, fd); return -1; }
    if (c->len < head + (size_t)clen) return 0;
    c->used = head + (size_t)clen;
    const char *body = c->in + head;
    if (strncmp(c->in, "GET ", 4) == 0) {
        int health = strncmp(c->in + 4, "/health ", 8) == 0;
        char models[512];
        snprintf(models, sizeof models, "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\"}]}", model);
        int rc = strncmp(c->in + 4, "/v1/models ", 11) == 0 ? answer_json(epfd, fd, 200, models)
                 : answer_json(epfd, fd, health ? 200 : 404, health ? "" : "{\"detail\":\"Not Found\"}");
        if (rc < 0) return -1;
        next_request(c);
        return 1;
    }
    int stream = 0;
    const char *key = memmem(body, (size_t)clen, "\"stream\"", 8);
    if (key) {
        key += 8;
        while (key < body + clen && (*key == ' ' || *key == ':')) key++;
        stream = key + 4 <= body + clen && strncmp(key, "true", 4) == 0;
    }
    long max_tokens = number_after(body, (size_t)clen, "\"max_tokens\"");
    c->tokens = (max_tokens > 0 && max_tokens < tokens_full) ? (int)max_tokens : tokens_full;
    c->sent = 0;
    c->start = now_ms();
    c->serial = ++answers_begun;
    c->created = time(NULL);
    if (stream) {
        static const char head_text[] = "HTTP/1.1 200 OK\r\nserver: uvicorn\r\n"
                                        "content-type: text/event-stream; charset=utf-8\r\n"
                                        "transfer-encoding: chunked\r\n\r\n";
        if (put(epfd, fd, head_text, sizeof head_text - 1) < 0) return -1;
        c->phase = STREAMING;
    } else {
        c->phase = ANSWERING;
    }
    return 1;
}

/* Whatever is due on this connection at `now`. -1: the connection is gone. */
static int step(int epfd, int fd, struct conn *c, double now) {
    if (c->phase == ANSWERING) {
        if (now < c->start + c->tokens * delay_ms) return 0;
        char body[1536], id[40];
        answer_id(c, id);
        snprintf(body, sizeof body,
                 "{\"id\": \"%s\", \"object\": \"text_completion\", \"created\": %ld, \"model\": \"%s\", "
                 "\"system_fingerprint\": \"vllm-0.33.0+engine-floor\", \"choices\": [{\"index\": 0, "
                 "\"text\": \"floor\", \"logprobs\": null, \"finish_reason\": \"%s\", \"prompt_logprobs\": null, "
                 "\"prompt_token_ids\": null, \"routed_experts\": null, \"stop_reason\": null, \"token_ids\": null}], "
                 "\"usage\": {\"prompt_tokens\": 1, \"completion_tokens\": %d, \"total_tokens\": %d, "
                 "\"completion_tokens_details\": null, \"prompt_tokens_details\": null}, \"ec_transfer_params\": null, "
                 "\"kv_transfer_params\": null, \"metrics\": null, \"service_tier\": null}",
                 id, (long)c->created, model, c->tokens < tokens_full ? "length" : "stop", c->tokens, c->tokens + 1);
        if (answer_json(epfd, fd, 200, body) < 0) return -1;
    } else {
        while (c->sent < c->tokens && now >= c->start + (c->sent + 1) * delay_ms) {
            if (token_event(epfd, fd, c, c->sent, NULL) < 0) return -1;
            c->sent++;
        }
        if (c->sent < c->tokens) return 0;
        if (token_event(epfd, fd, c, c->sent, c->tokens < tokens_full ? "\"length\"" : "\"stop\"") < 0) return -1;
        if (event(epfd, fd, "[DONE]") < 0) return -1;
        if (put(epfd, fd, "0\r\n\r\n", 5) < 0) return -1;
    }
    answered++;
    if (c->close_after) { drop(epfd, fd); return -1; }
    next_request(c);
    return take_request(epfd, fd, c);  /* a request that came behind this one */
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: engine_floor PORT LOG MODEL [TOKENS] [DELAY_MS] [IDLE]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    const char *log_path = argv[2];
    model = argv[3];
    if (argc > 4) tokens_full = atoi(argv[4]);
    if (argc > 5) delay_ms = atof(argv[5]);
    double idle_ms = (argc > 6 ? atof(argv[6]) : 120.0) * 1000.0;
    if (port <= 0 || tokens_full <= 0 || delay_ms < 0 || strlen(model) > 200) {
        fprintf(stderr, "engine_floor: bad arguments\n");
        return 2;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    int epfd, one = 1;
    int lfd = floor_listen(port, SOCK_NONBLOCK, &epfd, "engine_floor: bind/listen");
    if (lfd < 0) return 1;
    FILE *log = fopen(log_path, "a");
    if (!log) {
        perror("engine_floor: log");
        return 1;
    }
    fprintf(log, "(APIServer pid=%d) INFO:     Application startup complete.\n", (int)getpid());
    fclose(log);
    printf("engine_floor: listening on 127.0.0.1:%d (%d tokens, %.1f ms each)\n", port, tokens_full, delay_ms);
    fflush(stdout);

    struct epoll_event events[256];
    double last_busy = now_ms();
    while (!stopping) {
        /* Sleep until the next due answer, at most 100 ms (1 ms is epoll's grain). */
        double now = now_ms(), due = now + 100.0;
        int open = 0;
        for (int fd = 0; fd <= top_fd; fd++) {
            struct conn *c = conns[fd];
            if (!c) continue;
            open++;
            if (c->phase == ANSWERING && c->start + c->tokens * delay_ms < due) due = c->start + c->tokens * delay_ms;
            if (c->phase == STREAMING && c->start + (c->sent + 1) * delay_ms < due) due = c->start + (c->sent + 1) * delay_ms;
        }
        if (open) last_busy = now;
        else if (now - last_busy > idle_ms) break;
        int wait = due <= now ? 0 : (int)(due - now + 0.999);
        int n = epoll_wait(epfd, events, 256, wait);
        if (n < 0 && errno != EINTR) break;
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                int cfd;
                while ((cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (cfd >= MAX_FDS) { close(cfd); continue; }
                    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conns[cfd] = calloc(1, sizeof(struct conn));
                    if (cfd > top_fd) top_fd = cfd;
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = cfd};
                    epoll_ctl(epfd, EPOLL_CTL_ADD, cfd, &cev);
                }
                continue;
            }
            struct conn *c = conns[fd];
            if (!c) continue;
            ssize_t got = recv(fd, c->in + c->len, INBUF - c->len, 0);
            if (got <= 0) {
                if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                drop(epfd, fd);
                continue;
            }
            c->len += (size_t)got;
            if (c->phase == READING) take_request(epfd, fd, c);
        }
        now = now_ms();
        for (int fd = 0; fd <= top_fd; fd++)
            if (conns[fd] && conns[fd]->phase != READING) step(epfd, fd, conns[fd], now);
    }
    printf("engine_floor: stopping; %ld answers, %ld connections cut for not reading\n", answered, cut);
    return 0;
}
