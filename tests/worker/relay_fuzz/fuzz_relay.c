/* bakery-relay under libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer, in one process.
 *
 * Each input is a script: the first bytes choose the stream's limits, whether a head is handed and
 * how little the client's socket takes at once; the next bytes generate the engine's chunked framing
 * (chunk sizes from 1 to past 64 KiB, CRLF or bare LF, extensions, leading zeros, blanks, trailers,
 * a broken frame, a hang-up or half-close, bytes after the end); the rest drive the run (engine
 * writes cut anywhere, the relay's turns, client reads, stalls on the relay's own clock, a client
 * reset). Then everything left is written and read, and a stream still open is aborted.
 *
 * Checked on every input: exactly one done message, for this stream; the client got the head first
 * iff the done message says so, and nothing without it; what it got is chunk framing whose data is a
 * prefix of the engine's data, in order, whole when the outcome is the body's end; the bytes count
 * is the engine's data at that end; no descriptor is left open. LeakSanitizer checks the buffers.
 *
 * Built and run by tests/worker/test_relay_fuzz.py (make fuzz-relay for a longer run).
 */
#define BAKERY_RELAY_NO_MAIN
#include "bakery_relay.c"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>

#define ENGINE_CAP (2u << 20)  /* the engine's bytes of one input, at most */
#define CLIENT_CAP (6u << 20)  /* what the client can receive (a head and 2x the engine's bytes) */
#define IDLE_STEPS 40

static const char HEAD[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

struct reader {
    const uint8_t *p;
    size_t n, i;
};

static unsigned byte(struct reader *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static unsigned word(struct reader *r) { return byte(r) | byte(r) << 8; }

static char *engine, *client;
static uint8_t *payload;
static size_t engine_len, client_len, payload_len;
static int64_t fake_now;
static int ctl_ours = -1;

static int64_t fake_clock(void) { return fake_now; }

static void fail(const char *why) {
    fprintf(stderr, "fuzz_relay: %s\n", why);
    abort();
}

static void add(const void *bytes, size_t n) {
    if (n > ENGINE_CAP - engine_len) n = ENGINE_CAP - engine_len;
    memcpy(engine + engine_len, bytes, n);
    engine_len += n;
}

static void add_text(const char *text) { add(text, strlen(text)); }

/* `size` bytes of chunk data, each one distinct from its neighbours (a reordering shows). */
static void add_data(size_t size) {
    for (size_t i = 0; i < size && payload_len < ENGINE_CAP; i++) {
        uint8_t b = (uint8_t)(payload_len * 131 + payload_len / 251);
        payload[payload_len++] = b;
        add(&b, 1);
    }
}

/* One data chunk of `size` bytes, its size line written in the style `style` selects. */
static void add_chunk(size_t size, unsigned style) {
    char line[64];
    int zeros = style & 4 ? 3 : 0;
    snprintf(line, sizeof line, style & 8 ? "%0*zX" : "%0*zx", zeros + 1, size);
    add_text(line);
    if (style & 16) add_text(" \t");
    if (style & 2) add_text(";name=value");
    add_text(style & 1 ? "\n" : "\r\n");
    add_data(size);
    add_text("\r\n");
}

/* The engine's bytes; 1 when they hold the body's end. */
static int generate(struct reader *r, unsigned ops) {
    for (unsigned k = 0; k < ops && engine_len < ENGINE_CAP - 80000; k++) {
        unsigned op = byte(r);
        switch (op & 7) {
        case 0: case 1: case 2: case 3: {
            static const size_t lo[] = {1, 17, 4097, 65537}, span[] = {16, 4080, 61440, 8000};
            unsigned cls = (op >> 3) & 3;
            size_t size = lo[cls] + word(r) % span[cls];
            unsigned style = byte(r), repeat = 1 + (op >> 5) * (cls == 0 ? 600 : 1);
            for (unsigned i = 0; i < repeat && engine_len < ENGINE_CAP - 80000; i++) add_chunk(size, style);
            break;
        }
        case 4: { /* the last chunk, a trailer, then maybe bytes after the end */
            add_text(op & 8 ? "0;x=1\n" : "0\r\n");
            if (op & 16) add_text(op & 32 ? "Trailer: x\n" : "Trailer: x\r\n");
            add_text(op & 64 ? "\n" : "\r\n");
            if (op & 128) add_text("HTTP/1.1 200 OK\r\n");
            return 1;
        }
        case 5: { /* a broken frame */
            static const char *broken[] = {"zz\r\n", "XY", "12345678901234567\r\n", "-1\r\n", "\rX"};
            unsigned which = (op >> 3) % 6;
            if (which == 1 || which == 4) { /* a chunk's data, then no CRLF after it */
                add_text("3\r\n");
                add_data(3);
            }
            if (which < 5) add_text(broken[which]);
            else for (unsigned i = 0; i < 4200; i++) add_text("9"); /* a size line over the bound */
            return 0;
        }
        default: /* 6, 7: the hang-up or half-close is a drive action; stop generating here */
            return 0;
        }
    }
    return 0;
}

static int open_fds(void) {
    int count = 0;
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL) fail("no /proc/self/fd");
    while (readdir(dir) != NULL) count++;
    closedir(dir);
    return count;
}

/* Read what the client socket has (the relay's writes). */
static void client_read(int fd, size_t most) {
    while (most) {
        size_t room = CLIENT_CAP - client_len;
        if (room == 0) fail("the client got more than the engine's bytes can make");
        ssize_t n = recv(fd, client + client_len, most < room ? most : room, MSG_DONTWAIT);
        if (n <= 0) return;
        client_len += (size_t)n;
        most -= (size_t)n;
    }
}

static size_t engine_write(int fd, size_t at, size_t most) {
    if (at >= engine_len) return at;
    size_t n = engine_len - at < most ? engine_len - at : most;
    ssize_t sent = send(fd, engine + at, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    return sent > 0 ? at + (size_t)sent : at;
}

/* The done messages waiting on the control socket: how many, and the last one. */
static int done_messages(uint32_t *id, uint16_t *outcome, uint16_t *flags, uint64_t *bytes) {
    unsigned char msg[16];
    int count = 0;
    while (recv(ctl_ours, msg, sizeof msg, MSG_DONTWAIT) == (ssize_t)sizeof msg) {
        memcpy(id, msg, 4);
        memcpy(outcome, msg + 4, 2);
        memcpy(flags, msg + 6, 2);
        memcpy(bytes, msg + 8, 8);
        count++;
    }
    return count;
}

/* The client's bytes after the head: chunk framing whose data is a prefix of the payload; returns
 * the data length, and whether the framing ended on a chunk's boundary. */
static size_t check_framing(const char *c, size_t len, int *whole) {
    size_t pos = 0, data = 0;
    *whole = 1;
    while (pos < len) {
        size_t start = pos, size = 0, digits = 0;
        while (pos < len && isxdigit((unsigned char)c[pos])) {
            if (++digits > 15) fail("a size line of more than 15 digits reached the client");
            size = size * 16 + (size_t)(c[pos] <= '9' ? c[pos] - '0' : (c[pos] | 0x20) - 'a' + 10);
            pos++;
        }
        if (pos == len) { *whole = 0; break; }
        if (digits == 0 || c[pos] != '\r') fail("a size line the client got is not hex digits and CRLF");
        if (++pos == len) { *whole = 0; break; }
        if (c[pos++] != '\n') fail("a size line the client got does not end in CRLF");
        if (size == 0) fail("the client got a last chunk (the worker writes it)");
        size_t take = len - pos < size ? len - pos : size;
        if (data + take > payload_len || memcmp(c + pos, payload + data, take) != 0)
            fail("the client's data is not the engine's, in order");
        data += take;
        pos += take;
        if (take < size) { *whole = 0; break; }
        if (pos + 2 > len) {
            if (pos < len && c[pos] != '\r') fail("a chunk the client got lacks its CRLF");
            *whole = 0;
            break;
        }
        if (c[pos] != '\r' || c[pos + 1] != '\n') fail("a chunk the client got lacks its CRLF");
        pos += 2;
        (void)start;
    }
    return data;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static uint32_t next_id;
    if (engine == NULL) {
        engine = malloc(ENGINE_CAP);
        client = malloc(CLIENT_CAP);
        payload = malloc(ENGINE_CAP);
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) fail("socketpair");
        ctl_ours = pair[0];
        now_ms = fake_clock;
        if (relay_setup(pair[1]) < 0) fail("relay_setup");
    }
    struct reader r = {data, size, 0};
    unsigned setup = byte(&r), ops = byte(&r);
    static const uint32_t limits[] = {0, 0, 150, 1000};
    uint32_t idle_ms = limits[setup & 3], send_ms = limits[(setup >> 2) & 3];
    int with_head = setup & 16, tiny = setup & 32;
    engine_len = client_len = payload_len = 0;
    int ended = generate(&r, ops);

    int before = open_fds();
    int e[2], c[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, e) < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, c) < 0)
        fail("socketpair");
    int big = 1 << 20, small = 4096;
    setsockopt(e[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    if (tiny) setsockopt(c[1], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    uint32_t id = ++next_id;
    unsigned char start[START_LEN + sizeof HEAD];
    start[0] = 'S';
    memcpy(start + 1, &id, 4);
    memcpy(start + 5, &idle_ms, 4);
    memcpy(start + 9, &send_ms, 4);
    size_t start_len = START_LEN;
    if (with_head) {
        memcpy(start + START_LEN, HEAD, sizeof HEAD - 1);
        start_len += sizeof HEAD - 1;
    }
    char cbuf[CMSG_SPACE(2 * sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {.iov_base = start, .iov_len = start_len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int fds[2] = {c[1], e[1]};
    memcpy(CMSG_DATA(cm), fds, sizeof fds);
    if (sendmsg(ctl_ours, &mh, 0) < 0) fail("sendmsg");
    close(c[1]);
    close(e[1]);

    size_t at = 0;
    int engine_open = 1, client_open = 1, client_reads = 1, done = 0;
    uint32_t got_id = 0;
    uint16_t outcome = 0, flags = 0;
    uint64_t bytes = 0;
    /* The run the input drives. */
    while (!done && r.i < r.n) {
        unsigned a = byte(&r);
        switch (a & 7) {
        case 0: case 1: if (engine_open) at = engine_write(e[0], at, 1 + (a >> 3) * (a & 1 ? 4099 : 7)); break;
        case 2: if (client_open && client_reads) client_read(c[0], 1 + (a >> 3) * 513); break;
        case 3: fake_now += (a >> 3) * 40; break; /* a stall: time passes, nobody reads */
        case 4: if (engine_open && (a >> 3) == 31) { close(e[0]); engine_open = 0; } break;
        case 5: if (engine_open && (a >> 3) == 31) shutdown(e[0], SHUT_WR); break;
        case 6: if (client_open && (a >> 3) == 31) { close(c[0]); client_open = 0; } break;
        case 7: if ((a >> 3) == 31) client_reads = 0; break; /* the client never reads again */
        default: break;
        }
        if (relay_turn(0) < 0) fail("relay_turn");
        fake_now += 1;
        int n = done_messages(&got_id, &outcome, &flags, &bytes);
        if (n > 1) fail("more than one done message");
        done = n;
    }
    /* Then everything: the engine's rest, the client reading all of it, until nothing moves for
     * IDLE_STEPS turns of 50 ms on the relay's clock (past every limit a stream can have). */
    for (int idle = 0; !done && idle < IDLE_STEPS;) {
        size_t was_at = at, was_len = client_len;
        if (engine_open) at = engine_write(e[0], at, 1 << 20);
        if (client_open && client_reads) client_read(c[0], CLIENT_CAP);
        if (relay_turn(0) < 0) fail("relay_turn");
        int moved = at != was_at || client_len != was_len;
        idle = moved ? 0 : idle + 1;
        fake_now += moved ? 1 : 50;
        int n = done_messages(&got_id, &outcome, &flags, &bytes);
        if (n > 1) fail("more than one done message");
        done = n;
    }
    if (!done) { /* a stream that is rightly still open (no end, no limit): the worker's abort ends it */
        for (size_t i = 0; i < nslots; i++) {
            struct stream *s = &streams[i];
            if (!s->used || s->id != id) continue;
            if (s->pending && s->send_ms) fail("a pending client write outlived the send limit");
            if (!s->pending && s->idle_ms && s->ended_outcome < 0) fail("a silent engine outlived the idle limit");
        }
        unsigned char abort_msg[5] = {'A'};
        memcpy(abort_msg + 1, &id, 4);
        if (send(ctl_ours, abort_msg, sizeof abort_msg, 0) < 0) fail("send abort");
        for (int step = 0; !done && step < 100; step++) {
            if (relay_turn(0) < 0) fail("relay_turn");
            done = done_messages(&got_id, &outcome, &flags, &bytes);
        }
        if (!done) fail("no done message after an abort");
        if (outcome != OUT_ABORTED) fail("an abort did not end the stream as aborted");
    }
    if (relay_turn(0) < 0) fail("relay_turn");
    uint32_t extra_id;
    uint16_t extra_outcome, extra_flags;
    uint64_t extra_bytes;
    if (done_messages(&extra_id, &extra_outcome, &extra_flags, &extra_bytes)) fail("a second done message");
    if (got_id != id) fail("a done message for another stream");
    if (client_open) client_read(c[0], CLIENT_CAP); /* what was sent before the end, read now */

    /* The head: first and whole iff the done message says it went; nothing goes without it. */
    const char *body = client;
    size_t body_len = client_len;
    if (with_head) {
        if (flags & DONE_HEAD_WRITTEN) {
            if (client_open && (client_len < sizeof HEAD - 1 || memcmp(client, HEAD, sizeof HEAD - 1) != 0))
                fail("the head was said written but the client did not get it first");
            if (client_len >= sizeof HEAD - 1) {
                body += sizeof HEAD - 1;
                body_len -= sizeof HEAD - 1;
            } else {
                body_len = 0;
            }
        } else if (client_len) {
            fail("the client got bytes though the head was not written");
        }
    } else if (flags & DONE_HEAD_WRITTEN) {
        fail("a head was said written though none was handed");
    }
    int whole;
    size_t moved = check_framing(body, body_len, &whole);
    if (outcome == OUT_END || outcome == OUT_END_EXTRA) {
        if (!ended) fail("the body's end reported for an engine that sent none");
        if (bytes != payload_len) fail("the bytes count at the body's end is not the engine's data");
        if (client_open && (moved != payload_len || !whole)) fail("the client did not get the whole body");
    } else if (bytes > payload_len) {
        fail("more bytes counted than the engine sent");
    }
    if (outcome > OUT_CLIENT_STALLED || outcome == OUT_REFUSED) fail("an outcome the stream cannot have");
    if (engine_open) close(e[0]);
    if (client_open) close(c[0]);
    if (open_fds() != before) fail("a descriptor was left open");
    return 0;
}
