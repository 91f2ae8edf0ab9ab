/* fl_crc.h - CRC-32 (IEEE 802.3, as zip and zlib use) and CRC-32C (Castagnoli, as TFRecord
 * files use), table-driven eight bytes at a time. Thread-safe; the tables are built once. */
#ifndef FL_CRC_H
#define FL_CRC_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC-32 over len bytes: start with crc = 0. Never fails. */
uint32_t fl_crc32(uint32_t crc, const void *data, size_t len);

/* Continues a CRC-32C over len bytes: start with crc = 0. Never fails. */
uint32_t fl_crc32c(uint32_t crc, const void *data, size_t len);

/* TFRecord's masked CRC-32C of data: rotate right by 15 and add 0xa282ead8. */
uint32_t fl_crc32c_masked(const void *data, size_t len);

#endif
