/* bakery-relay: the body of a streamed engine answer moved to the client without Python per event.
 *
 * Why (issue 24): once the worker is down to one engine read and one client write per streamed
 * event, what is left of its cost is the Python callback around each of them (uvloop's
 * data_received, bakery's chunk check, transport.write): ~5-7 us an event over the kernel's own
 * recv and send. This helper does the same two system calls from one epoll loop in C.
 *
 * How: the worker (engine/native_relay.py) starts it with one end of a SOCK_SEQPACKET
 * socketpair as its only argument. Once an answer's head is in (and whatever came with it written to
 * the client), the worker sends a start message with the client's and the engine's sockets
 * (SCM_RIGHTS; the kernel hands this process its own descriptors of them) and, when the client has
 * not been written anything yet, the answer's head as the worker would write it: the helper writes
 * that head with the body's first bytes in one send (or alone at an empty body's end), so a stream's
 * first token waits for no turn of the worker's busy loop; if the body fails before any of it, the
 * head is not written and the worker can still answer with an error. From then on the helper reads the
 * engine's chunked body and writes it to the client as it comes, the chunks' framing as the engine
 * wrote it (a size line with an extension is written without it), never holding an event back. It
 * stops at the body's last chunk (that chunk and any trailer are read, not written: the worker
 * writes the client's last chunk itself) and answers with a done message: the outcome and the body
 * bytes moved. The engine connection is then the worker's again, positioned after the answer, so it
 * can be kept alive.
 *
 * Backpressure: a client that does not take a write whole stops the engine's reads (its descriptor
 * leaves the epoll set, so a hang-up cannot wake a read either) until the rest is written. Each
 * stream has two time limits: idle (no engine byte read for that long, while the body goes on) and
 * send (a pending client write that takes no byte for that long, in every state, the body's end
 * read or not). A message that the worker sends with an unknown id, or an abort, is a no-op or ends
 * the stream (descriptors closed, no more writes). SIGTERM and SIGINT are ignored: during the worker's drain the streams in
 * flight are finished here; the helper exits when the worker's end of the socketpair closes (or,
 * via PR_SET_PDEATHSIG, when the worker dies).
 *
 *   bakery-relay CONTROL_FD
 *
 * Messages (little-endian, packed): start  'S' u32 id u32 idle_ms u32 send_ms [head, up to HEAD_MAX
 * bytes], with two descriptors (client, engine); 0 ms is no limit; abort 'A' u32 id. Done: u32 id, u16 outcome (the OUT_* values),
 * u16 flags (DONE_HEAD_WRITTEN: the start's head reached the client), u64 body bytes.
 * Built statically (bakery/host/relay.py), so it runs on any base whatever its C library. With
 * BAKERY_RELAY_NO_MAIN defined, the file is the fuzz harness's library (tests/worker/relay_fuzz/).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum {
    OUT_END = 0,         /* the last chunk and its trailer read, nothing after them */
    OUT_END_EXTRA = 1,   /* as OUT_END, but the engine sent bytes after the answer */
    OUT_ENGINE_EOF = 2,  /* the engine closed its connection before the body's end */
    OUT_ENGINE_ERR = 3,  /* a read of the engine failed */
    OUT_MALFORMED = 4,   /* the engine's chunked framing is broken */
    OUT_CLIENT_GONE = 5, /* a write to the client failed */
    OUT_IDLE = 6,        /* no engine byte within the stream's idle limit */
    OUT_ABORTED = 7,     /* the worker asked for the stream's end */
    OUT_REFUSED = 8,     /* the helper could not take the stream (no slot, a bad message) */
    OUT_CLIENT_STALLED = 9, /* a pending client write took no byte within the stream's send limit */
};

enum { ST_LINE, ST_DATA, ST_CRLF, ST_TRAILER, ST_DONE };
enum { DONE_HEAD_WRITTEN = 1 };

#define READ_MAX 65536
#define LINE_MAX_LEN 4096
/* What one read can become for the client: every size line ending in this read is written in at most
 * one byte more than came (a bare LF becomes CRLF; a line that is not plain is written as at most 15
 * hex digits and CRLF, never longer than its digits and LF plus one), so at most 2 x READ_MAX, plus
 * the start of a size line carried over from earlier reads. put() checks every append against it. */
#define OUT_MAX (2 * READ_MAX + LINE_MAX_LEN + 64)
#define START_LEN 13 /* 'S', id, idle_ms, send_ms */
#define HEAD_MAX 16384 /* an answer head the worker hands over with a stream (its own bound is 8 KiB) */
#define IDLE_SCAN_MS 100

struct stream {
    int used;
    uint32_t id;
    int cfd, efd;
    int state;
    uint64_t left;      /* data bytes left in the current chunk */
    int crlf;           /* bytes of the CRLF after a chunk's data already seen */
    char line[LINE_MAX_LEN + 2];
    size_t line_len;
    char *pending;      /* bytes a client write did not take */
    size_t pending_len, pending_off;
    uint64_t bytes;     /* body data bytes moved */
    char *head;         /* the answer's head, not yet written (NULL: none, or written) */
    size_t head_len;
    int head_written;
    uint32_t idle_ms, send_ms;
    int64_t last_read;
    int64_t last_sent;  /* when a client write last took a byte (or the pending write began) */
    int ended_outcome;  /* the outcome to report once pending bytes are written, -1 while streaming */
};

static struct stream *streams;
static size_t nslots;
static int epfd, ctl;

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t (*now_ms)(void) = monotonic_ms; /* the fuzz harness runs the limits on its own clock */

static void say_done(uint32_t id, uint16_t outcome, uint16_t flags, uint64_t bytes) {
    unsigned char msg[16];
    memcpy(msg, &id, 4);
    memcpy(msg + 4, &outcome, 2);
    memcpy(msg + 6, &flags, 2);
    memcpy(msg + 8, &bytes, 8);
    while (send(ctl, msg, sizeof msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
}

static void finish(struct stream *s, int outcome) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, s->efd, NULL); /* either may be out of the set already: ENOENT */
    epoll_ctl(epfd, EPOLL_CTL_DEL, s->cfd, NULL);
    close(s->efd);
    close(s->cfd);
    free(s->pending);
    s->pending = NULL;
    free(s->head);
    s->head = NULL;
    s->used = 0;
    say_done(s->id, (uint16_t)outcome, s->head_written ? DONE_HEAD_WRITTEN : 0, s->bytes);
}

static uint64_t tag(size_t slot, int client) { return ((uint64_t)slot << 1) | (uint64_t)client; }

/* Wait for the client to take the rest: no engine reads until then. The engine's descriptor leaves
 * the set: an epoll mask of 0 still reports a hang-up or an error, which would read the engine (and
 * write its bytes) ahead of the pending ones. */
static void hold(struct stream *s, size_t slot) {
    struct epoll_event out = {.events = EPOLLOUT, .data.u64 = tag(slot, 1)};
    epoll_ctl(epfd, EPOLL_CTL_DEL, s->efd, NULL);
    epoll_ctl(epfd, EPOLL_CTL_ADD, s->cfd, &out);
    s->last_sent = now_ms();
}

static int release(struct stream *s, size_t slot) {
    struct epoll_event in = {.events = EPOLLIN, .data.u64 = tag(slot, 0)};
    epoll_ctl(epfd, EPOLL_CTL_DEL, s->cfd, NULL);
    return epoll_ctl(epfd, EPOLL_CTL_ADD, s->efd, &in);
}

/* Write buf to the client after anything pending; what it does not take is kept. 0, or -1 when the
 * client is gone. */
static int write_client(struct stream *s, size_t slot, const char *buf, size_t len) {
    size_t off = 0;
    if (s->pending) { /* never while held (no engine reads then); kept in order all the same */
        size_t rest = s->pending_len - s->pending_off;
        char *more = malloc(rest + len);
        if (more == NULL) return -1;
        memcpy(more, s->pending + s->pending_off, rest);
        memcpy(more + rest, buf, len);
        free(s->pending);
        s->pending = more;
        s->pending_len = rest + len;
        s->pending_off = 0;
        return 0;
    }
    while (off < len) {
        ssize_t n = send(s->cfd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        return -1;
    }
    if (off < len) {
        s->pending = malloc(len - off);
        if (s->pending == NULL) return -1;
        memcpy(s->pending, buf + off, len - off);
        s->pending_len = len - off;
        s->pending_off = 0;
        hold(s, slot);
    }
    return 0;
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* A chunk-size line (without its LF): its size, or -1 when it is not one. *plain says whether it is
 * hex digits and a CR alone (then it is written as it came). */
static int64_t size_line(const char *line, size_t len, int *plain) {
    size_t i = 0, digits = 0;
    uint64_t size = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    size_t first = i;
    while (i < len && is_hex(line[i])) {
        if (++digits > 15) return -1;
        char c = line[i++];
        size = size * 16 + (uint64_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    if (digits == 0) return -1;
    *plain = first == 0 && i + 1 == len && line[i] == '\r';
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
    if (i < len && line[i] != ';') return -1;
    return (int64_t)size;
}

static int blank(const char *line, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r') return 0;
    return 1;
}

/* Append n bytes to out (cap bytes of room): 0, or -1 when they do not fit (OUT_MAX says why they
 * always do; a framing that proves it wrong is refused as malformed, never written past the room). */
static int put(char *out, size_t *out_len, size_t cap, const char *bytes, size_t n) {
    if (n > cap - *out_len) return -1;
    memcpy(out + *out_len, bytes, n);
    *out_len += n;
    return 0;
}

/* Parse one engine read, appending what the client gets to out (cap bytes of room). Returns -1
 * (malformed) or the number of bytes of data after the body's end (0 when none, or the body goes on). */
static ssize_t parse(struct stream *s, const char *data, size_t len, char *out, size_t *out_len, size_t cap) {
    size_t pos = 0;
    while (pos < len && s->state != ST_DONE) {
        if (s->state == ST_DATA) {
            size_t take = len - pos < s->left ? len - pos : (size_t)s->left;
            if (put(out, out_len, cap, data + pos, take) < 0) return -1;
            pos += take;
            s->left -= take;
            s->bytes += take;
            if (s->left == 0) { s->state = ST_CRLF; s->crlf = 0; }
        } else if (s->state == ST_CRLF) {
            while (pos < len && s->crlf < 2) {
                if (data[pos] != "\r\n"[s->crlf] || put(out, out_len, cap, data + pos, 1) < 0) return -1;
                pos++;
                s->crlf++;
            }
            if (s->crlf == 2) { s->state = ST_LINE; s->line_len = 0; }
        } else {  /* ST_LINE or ST_TRAILER: a line up to its LF */
            const char *nl = memchr(data + pos, '\n', len - pos);
            size_t piece = nl ? (size_t)(nl - (data + pos)) : len - pos;
            if (s->line_len + piece > LINE_MAX_LEN) return -1;
            memcpy(s->line + s->line_len, data + pos, piece);
            s->line_len += piece;
            pos += piece;
            if (!nl) break;
            pos++;  /* the LF */
            if (s->state == ST_TRAILER) {
                if (blank(s->line, s->line_len)) s->state = ST_DONE;
                s->line_len = 0;
                continue;
            }
            int plain = 0;
            int64_t size = size_line(s->line, s->line_len, &plain);
            if (size < 0) return -1;
            if (size == 0) {
                s->state = ST_TRAILER;
            } else {
                char canonical[24];
                const char *line = s->line;
                size_t line_len = s->line_len;
                if (!plain) { /* an extension, blanks or a bare LF: hex digits and CRLF alone */
                    line_len = (size_t)snprintf(canonical, sizeof canonical, "%llx\r", (unsigned long long)size);
                    line = canonical;
                }
                if (put(out, out_len, cap, line, line_len) < 0 || put(out, out_len, cap, "\n", 1) < 0) return -1;
                s->state = ST_DATA;
                s->left = (uint64_t)size;
            }
            s->line_len = 0;
        }
    }
    return (ssize_t)(len - pos);
}

/* The head still to be written, put right before out[0] (which has HEAD_MAX bytes of room before it):
 * where the client's write starts. */
static char *with_head(struct stream *s, char *out, size_t *out_len) {
    if (s->head == NULL) return out;
    char *start = out - s->head_len;
    memcpy(start, s->head, s->head_len);
    *out_len += s->head_len;
    free(s->head);
    s->head = NULL;
    s->head_written = 1;
    return start;
}

static void engine_readable(size_t slot) {
    static char buf[READ_MAX], room[HEAD_MAX + OUT_MAX];
    char *out = room + HEAD_MAX;
    struct stream *s = &streams[slot];
    ssize_t got = recv(s->efd, buf, sizeof buf, MSG_DONTWAIT);
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        finish(s, OUT_ENGINE_ERR);
        return;
    }
    if (got == 0) {
        finish(s, OUT_ENGINE_EOF);
        return;
    }
    s->last_read = now_ms();
    size_t out_len = 0;
    ssize_t after = parse(s, buf, (size_t)got, out, &out_len, OUT_MAX);
    if (after < 0) {
        /* What was whole before the break still goes, once the head went: the client then sees the
         * body cut. Before it, nothing goes: the worker answers with an error instead. */
        if (out_len && s->head == NULL) write_client(s, slot, out, out_len);
        finish(s, OUT_MALFORMED);
        return;
    }
    if (s->state == ST_DONE || out_len) {  /* an empty body's end writes the head alone */
        char *start = with_head(s, out, &out_len);
        if (out_len && write_client(s, slot, start, out_len) < 0) {
            finish(s, OUT_CLIENT_GONE);
            return;
        }
    }
    if (s->state == ST_DONE) {
        int outcome = after > 0 ? OUT_END_EXTRA : OUT_END;
        if (s->pending) s->ended_outcome = outcome;  /* reported once the client took the rest */
        else finish(s, outcome);
    }
}

static void client_writable(size_t slot) {
    struct stream *s = &streams[slot];
    if (s->pending == NULL) return;  /* a stale event of a slot taken again in the same batch */
    while (s->pending_off < s->pending_len) {
        ssize_t n = send(s->cfd, s->pending + s->pending_off, s->pending_len - s->pending_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) { s->pending_off += (size_t)n; s->last_sent = now_ms(); continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        finish(s, OUT_CLIENT_GONE);
        return;
    }
    free(s->pending);
    s->pending = NULL;
    if (s->ended_outcome >= 0) { finish(s, s->ended_outcome); return; }
    if (release(s, slot) < 0) finish(s, OUT_ENGINE_ERR);
}

static size_t free_slot(void) {
    for (size_t i = 0; i < nslots; i++)
        if (!streams[i].used) return i;
    size_t grown = nslots ? nslots * 2 : 256;
    struct stream *more = realloc(streams, grown * sizeof *more);
    if (more == NULL) return (size_t)-1;
    memset(more + nslots, 0, (grown - nslots) * sizeof *more);
    streams = more;
    size_t slot = nslots;
    nslots = grown;
    return slot;
}

static void refuse(uint32_t id, int *fds, int nfds) {
    for (int i = 0; i < nfds; i++) close(fds[i]);
    say_done(id, OUT_REFUSED, 0, 0);
}

/* One control message: 0, or -1 when the worker's end is closed. */
static int control(void) {
    static unsigned char msg[START_LEN + HEAD_MAX + 1];
    char cbuf[CMSG_SPACE(2 * sizeof(int))];
    struct iovec iov = {.iov_base = msg, .iov_len = sizeof msg};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    ssize_t n = recvmsg(ctl, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    if (n == 0) return -1;
    int fds[2] = {-1, -1}, nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < count; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (nfds < 2) fds[nfds++] = fd;
                else close(fd);
            }
        }
    }
    uint32_t id = 0;
    if (n >= 5) memcpy(&id, msg + 1, 4);
    if (n >= START_LEN && n <= START_LEN + HEAD_MAX && msg[0] == 'S' && nfds == 2 &&
        !(mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
        size_t slot = free_slot();
        if (slot == (size_t)-1) { refuse(id, fds, nfds); return 0; }
        struct stream *s = &streams[slot];
        memset(s, 0, sizeof *s);
        s->used = 1;
        s->id = id;
        s->cfd = fds[0];
        s->efd = fds[1];
        s->state = ST_LINE;
        s->ended_outcome = -1;
        memcpy(&s->idle_ms, msg + 5, 4);
        memcpy(&s->send_ms, msg + 9, 4);
        if (n > START_LEN) {
            s->head = malloc((size_t)n - START_LEN);
            if (s->head == NULL) {
                s->used = 0;
                refuse(id, fds, nfds);
                return 0;
            }
            memcpy(s->head, msg + START_LEN, (size_t)n - START_LEN);
            s->head_len = (size_t)n - START_LEN;
        }
        s->last_read = now_ms();
        struct epoll_event in = {.events = EPOLLIN, .data.u64 = tag(slot, 0)};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, s->efd, &in) < 0) {
            free(s->head);
            s->head = NULL;
            s->used = 0;
            refuse(id, fds, nfds);
        }
        return 0;
    }
    if (n == 5 && msg[0] == 'A') {
        for (int i = 0; i < nfds; i++) close(fds[i]);
        for (size_t i = 0; i < nslots; i++)
            if (streams[i].used && streams[i].id == id) { finish(&streams[i], OUT_ABORTED); break; }
        return 0;
    }
    refuse(id, fds, nfds);
    return 0;
}

/* The time limits: idle while the body goes on and nothing is pending; send while a write is pending,
 * whatever else the stream is in (the body's end read included: such a stream must not keep its
 * client's connection, its slot in the worker's count, or a drain waiting). */
static void scan_limits(int64_t now) {
    for (size_t i = 0; i < nslots; i++) {
        struct stream *s = &streams[i];
        if (!s->used) continue;
        if (s->pending && s->send_ms && now - s->last_sent >= (int64_t)s->send_ms)
            finish(s, OUT_CLIENT_STALLED);
        else if (s->idle_ms && s->ended_outcome < 0 && now - s->last_read >= (int64_t)s->idle_ms)
            finish(s, OUT_IDLE);
    }
}

static int64_t last_scan;

/* Take the control socket: 0, or -1 (said on stderr). */
static int relay_setup(int control_fd) {
    ctl = control_fd;
    epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ce = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, ctl, &ce) < 0) {
        perror("bakery-relay: epoll");
        return -1;
    }
    last_scan = now_ms();
    return 0;
}

/* One turn of the loop (waiting up to timeout_ms): 1 to go on, 0 when the worker is gone (so are its
 * streams), -1 on an error (said on stderr). */
static int relay_turn(int timeout_ms) {
    struct epoll_event events[256];
    int n = epoll_wait(epfd, events, 256, timeout_ms);
    if (n < 0 && errno != EINTR) {
        perror("bakery-relay: epoll_wait");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        uint64_t t = events[i].data.u64;
        if (t == UINT64_MAX) {
            if (control() < 0) return 0;
            continue;
        }
        size_t slot = (size_t)(t >> 1);
        if (slot >= nslots || !streams[slot].used) continue;
        if (t & 1) client_writable(slot);
        else if (streams[slot].pending == NULL) engine_readable(slot); /* a stale event of a held one */
    }
    int64_t now = now_ms();
    if (now - last_scan >= IDLE_SCAN_MS) {
        scan_limits(now);
        last_scan = now;
    }
    return 1;
}

#ifndef BAKERY_RELAY_NO_MAIN
int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: bakery-relay CONTROL_FD (started by the worker, not by hand)\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    if (relay_setup(atoi(argv[1])) < 0) return 1;
    int going;
    while ((going = relay_turn(IDLE_SCAN_MS)) > 0) {
    }
    return going < 0 ? 1 : 0;
}
#endif
