/* fl_crc.c - slicing-by-8 CRCs (Intel's method: eight table lookups per 8 input bytes).
 *
 * The tables are computed on first use under pthread_once, so any thread may call first.
 */
#include "base/fl_crc.h"

#include <pthread.h>
#include <string.h>

typedef struct crc_tables {
    uint32_t t[8][256];
} crc_tables;

static crc_tables crc32_tables, crc32c_tables;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* Fills the tables of a reflected CRC with polynomial `poly`. */
static void build(crc_tables *tables, uint32_t poly) {
    for (uint32_t byte = 0; byte < 256; byte++) {
        uint32_t crc = byte;
        for (int bit = 0; bit < 8; bit++)
            crc = crc & 1 ? (crc >> 1) ^ poly : crc >> 1;
        tables->t[0][byte] = crc;
    }
    for (int k = 1; k < 8; k++)
        for (int byte = 0; byte < 256; byte++)
            tables->t[k][byte] =
                (tables->t[k - 1][byte] >> 8) ^ tables->t[0][tables->t[k - 1][byte] & 0xff];
}

static void build_all(void) {
    build(&crc32_tables, 0xEDB88320u);  /* IEEE, reflected */
    build(&crc32c_tables, 0x82F63B78u); /* Castagnoli, reflected */
}

static uint32_t update(const crc_tables *tb, uint32_t crc, const unsigned char *p, size_t len) {
    crc = ~crc;
    for (; len >= 8; len -= 8, p += 8) {
        uint32_t low, high;
        memcpy(&low, p, 4);
        memcpy(&high, p + 4, 4);
        low ^= crc; /* little-endian load order: the slicing tables assume it */
        crc = tb->t[7][low & 0xff] ^ tb->t[6][(low >> 8) & 0xff] ^ tb->t[5][(low >> 16) & 0xff] ^
              tb->t[4][low >> 24] ^ tb->t[3][high & 0xff] ^ tb->t[2][(high >> 8) & 0xff] ^
              tb->t[1][(high >> 16) & 0xff] ^ tb->t[0][high >> 24];
    }
    while (len--)
        crc = (crc >> 8) ^ tb->t[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

uint32_t fl_crc32(uint32_t crc, const void *data, size_t len) {
    pthread_once(&tables_once, build_all);
    return update(&crc32_tables, crc, data, len);
}

uint32_t fl_crc32c(uint32_t crc, const void *data, size_t len) {
    pthread_once(&tables_once, build_all);
    return update(&crc32c_tables, crc, data, len);
}

uint32_t fl_crc32c_masked(const void *data, size_t len) {
    uint32_t crc = fl_crc32c(0, data, len);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
