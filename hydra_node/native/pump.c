/* Native pump of a tunnel data connection (see hydra_node/runtime/rpc/dataconn.py).
 *
 * Moves bytes between a plain TCP socket (llama.cpp's client or an RPC worker) and a
 * data connection that carries `u32 length || counter u64 || XChaCha20-Poly1305(data)`
 * frames, exactly as the Python pump does, until either side ends, a frame is bad or
 * `stop_fd` becomes readable.  It runs in a thread started by trio (the GIL is released
 * for the whole call); the AEAD functions are passed in from PyNaCl's own libsodium.
 * Both sockets may be non-blocking: the loop waits with poll().
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PLAIN 65536
#define OVERHEAD 24                      /* counter (8) + Poly1305 tag (16) */
#define MAX_FRAME (MAX_PLAIN + OVERHEAD)
#define IN_CAP (2 * (4 + MAX_FRAME))

typedef int (*aead_enc_t)(unsigned char *c, unsigned long long *clen, const unsigned char *m,
                          unsigned long long mlen, const unsigned char *ad, unsigned long long adlen,
                          const unsigned char *nsec, const unsigned char *npub, const unsigned char *k);
typedef int (*aead_dec_t)(unsigned char *m, unsigned long long *mlen, unsigned char *nsec,
                          const unsigned char *c, unsigned long long clen, const unsigned char *ad,
                          unsigned long long adlen, const unsigned char *npub, const unsigned char *k);

enum {
    END_TCP_EOF = 0, END_DATA_EOF = 1, END_STOPPED = 2, END_TCP_ERROR = 3, END_DATA_ERROR = 4,
    END_OVERSIZE = 5, END_TAMPER = 6, END_REORDER = 7, END_BAD_FRAME = 8
};

struct hydra_pump_stats {
    uint64_t plain_up;       /* bytes read from the TCP side and sealed */
    uint64_t plain_down;     /* bytes opened and written to the TCP side */
    uint64_t send_counter;   /* next frame counter, in and out */
    uint64_t recv_counter;
    uint64_t frames_up;
    uint64_t frames_down;
};

struct buf { unsigned char *p; size_t len, off; };

static void nonce_for(uint64_t counter, unsigned char nonce[24]) {
    memset(nonce, 0, 16);
    for (int i = 0; i < 8; i++) nonce[16 + i] = (unsigned char)(counter >> (56 - 8 * i));
}

/* Write what the socket takes now; 0 = fine (maybe partial), -1 = error. */
static int flush_some(int fd, struct buf *b) {
    while (b->off < b->len) {
        ssize_t n = write(fd, b->p + b->off, b->len - b->off);
        if (n > 0) { b->off += (size_t)n; continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return -1;
    }
    b->len = b->off = 0;
    return 0;
}

static int pump_loop(int tcp_fd, int data_fd, int stop_fd, const unsigned char *send_key,
                     const unsigned char *recv_key, aead_enc_t enc, aead_dec_t dec,
                     struct hydra_pump_stats *st, unsigned char *mem);

int hydra_pump(int tcp_fd, int data_fd, int stop_fd, const unsigned char *send_key,
               const unsigned char *recv_key, void *enc_fn, void *dec_fn, struct hydra_pump_stats *st) {
    aead_enc_t enc = (aead_enc_t)enc_fn;
    aead_dec_t dec = (aead_dec_t)dec_fn;
    unsigned char *mem = malloc(MAX_PLAIN + 4 + MAX_FRAME + MAX_PLAIN + IN_CAP);
    if (mem == NULL) return END_TCP_ERROR;
    int end = pump_loop(tcp_fd, data_fd, stop_fd, send_key, recv_key, enc, dec, st, mem);
    free(mem);
    return end;
}

static int pump_loop(int tcp_fd, int data_fd, int stop_fd, const unsigned char *send_key,
                     const unsigned char *recv_key, aead_enc_t enc, aead_dec_t dec,
                     struct hydra_pump_stats *st, unsigned char *mem) {
    unsigned char *plain = mem, *up_mem = plain + MAX_PLAIN, *down_mem = up_mem + 4 + MAX_FRAME;
    unsigned char *in_mem = down_mem + MAX_PLAIN;
    struct buf up = {up_mem, 0, 0}, down = {down_mem, 0, 0};
    size_t in_len = 0;
    unsigned char nonce[24];

    for (;;) {
        /* Open whole frames while the TCP side has taken everything before them. */
        while (down.len == 0 && in_len >= 4) {
            uint32_t flen = ((uint32_t)in_mem[0] << 24) | ((uint32_t)in_mem[1] << 16) |
                            ((uint32_t)in_mem[2] << 8) | in_mem[3];
            if (flen > MAX_FRAME) return END_OVERSIZE;
            if (flen < OVERHEAD) return END_BAD_FRAME;
            if (in_len < 4 + (size_t)flen) break;
            uint64_t counter = 0;
            for (int i = 0; i < 8; i++) counter = (counter << 8) | in_mem[4 + i];
            if (counter != st->recv_counter) return END_REORDER;
            nonce_for(counter, nonce);
            unsigned long long mlen = 0;
            if (dec(down_mem, &mlen, NULL, in_mem + 12, flen - 8, NULL, 0, nonce, recv_key) != 0)
                return END_TAMPER;
            st->recv_counter++;
            st->frames_down++;
            st->plain_down += mlen;
            down.len = (size_t)mlen;
            down.off = 0;
            memmove(in_mem, in_mem + 4 + flen, in_len - 4 - flen);
            in_len -= 4 + flen;
            if (flush_some(tcp_fd, &down) < 0) return END_TCP_ERROR;
        }

        struct pollfd p[3];
        p[0].fd = tcp_fd;  p[0].events = (short)((up.len == 0 ? POLLIN : 0) | (down.len ? POLLOUT : 0));
        p[1].fd = data_fd; p[1].events = (short)((down.len == 0 && in_len < IN_CAP ? POLLIN : 0) | (up.len ? POLLOUT : 0));
        p[2].fd = stop_fd; p[2].events = POLLIN;
        p[0].revents = p[1].revents = p[2].revents = 0;
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR) continue;
            return END_TCP_ERROR;
        }
        if (p[2].revents) return END_STOPPED;
        if (p[0].revents & POLLOUT && flush_some(tcp_fd, &down) < 0) return END_TCP_ERROR;
        if (p[1].revents & POLLOUT && flush_some(data_fd, &up) < 0) return END_DATA_ERROR;

        if (up.len == 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t n = read(tcp_fd, plain, MAX_PLAIN);
            if (n == 0) return END_TCP_EOF;
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return END_TCP_ERROR;
            if (n > 0) {
                uint64_t counter = st->send_counter++;
                uint32_t flen = (uint32_t)n + OVERHEAD;
                up_mem[0] = (unsigned char)(flen >> 24); up_mem[1] = (unsigned char)(flen >> 16);
                up_mem[2] = (unsigned char)(flen >> 8);  up_mem[3] = (unsigned char)flen;
                for (int i = 0; i < 8; i++) up_mem[4 + i] = (unsigned char)(counter >> (56 - 8 * i));
                nonce_for(counter, nonce);
                unsigned long long clen = 0;
                if (enc(up_mem + 12, &clen, plain, (unsigned long long)n, NULL, 0, NULL, nonce, send_key) != 0)
                    return END_DATA_ERROR;
                up.len = 12 + (size_t)clen;
                up.off = 0;
                st->frames_up++;
                st->plain_up += (uint64_t)n;
                if (flush_some(data_fd, &up) < 0) return END_DATA_ERROR;
            }
        }
        if (down.len == 0 && in_len < IN_CAP && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t n = read(data_fd, in_mem + in_len, IN_CAP - in_len);
            if (n == 0) return in_len ? END_BAD_FRAME : END_DATA_EOF;
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return END_DATA_ERROR;
            if (n > 0) in_len += (size_t)n;
        }
    }
}
