/*
 * core/json.h - the numbers of ckpt's JSON documents, one way everywhere
 * (the engines' *_to_json: diff, verify, scan paths).  cJSON keeps numbers
 * as doubles and prints them its own way, so integers are written as their
 * decimal digits and reals with the digits each document promises; values
 * that are not finite are the strings "nan", "inf" and "-inf".  Separate
 * from core.h so that only the files that write JSON see cJSON.
 */
#ifndef CKPT_CORE_JSON_H
#define CKPT_CORE_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

/* An integer, exact. */
cJSON *ckpt_json_int(long long v);
/* An array of N integers, exact. */
cJSON *ckpt_json_dims(const int64_t *d, int n);
/* A real with DIGITS significant digits (17: the double read back the same);
 * POINT: an integral value keeps a ".0" (a reader sees a float). */
cJSON *ckpt_json_real(double v, int digits, bool point);

/* Add ITEM to O as KEY (to array A): false, ITEM freed, when it or the
 * adding failed, so that a document is built without checking each step. */
bool ckpt_json_put(cJSON *o, const char *key, cJSON *item);
bool ckpt_json_append(cJSON *a, cJSON *item);

#endif /* CKPT_CORE_JSON_H */
