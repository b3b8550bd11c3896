/* core/json.c - the numbers of ckpt's JSON documents (core/json.h). */
#include "core/json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

cJSON *ckpt_json_int(long long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return cJSON_CreateRaw(buf);
}

cJSON *ckpt_json_dims(const int64_t *d, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, ckpt_json_int(d[i]));
    return a;
}

cJSON *ckpt_json_real(double v, int digits, bool point)
{
    if (isnan(v))
        return cJSON_CreateString("nan");
    if (isinf(v))
        return cJSON_CreateString(v < 0 ? "-inf" : "inf");
    char buf[48];
    snprintf(buf, sizeof buf - 2, "%.*g", digits, v);
    if (point && !strpbrk(buf, ".eEn"))
        strcat(buf, ".0");
    return cJSON_CreateRaw(buf);
}

bool ckpt_json_put(cJSON *o, const char *key, cJSON *item)
{
    if (item && cJSON_AddItemToObject(o, key, item))
        return true;
    cJSON_Delete(item);
    return false;
}

bool ckpt_json_append(cJSON *a, cJSON *item)
{
    if (item && cJSON_AddItemToArray(a, item))
        return true;
    cJSON_Delete(item);
    return false;
}
