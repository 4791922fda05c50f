/* unit_peers: the cluster sum of GET /stats (peers_sum, peers_cluster_tidy).
 * Two instances' counters, as peers_self_json makes them, added up: every
 * count doubles, and nothing that is a maximum, a mean or a last value is
 * left in the sum, where adding would make it a lie (two instances' largest
 * batches of 5 are not a batch of 10). */
#include <string.h>

#include "peers.h"
#include "counters.h"
#include "t.h"

/* The path of the first number under 'o' whose name reads as a maximum,
 * a mean or a last value; NULL when none. */
static const char *non_count(const cJSON *o, char *path, size_t n)
{
    const cJSON *it;

    cJSON_ArrayForEach(it, o) {
        if (cJSON_IsObject(it) && non_count(it, path, n) != NULL)
            return path;
        if (cJSON_IsNumber(it) &&
            (strcmp(it->string, "largest") == 0 || strstr(it->string, "Max") != NULL ||
             strstr(it->string, "Mean") != NULL || strstr(it->string, "Last") != NULL)) {
            snprintf(path, n, "%s", it->string);
            return path;
        }
    }
    return NULL;
}

static double num(const cJSON *o, const char *obj, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, obj), name);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

static void test_the_sum_adds_counts_and_drops_the_rest(void)
{
    cJSON *self, *cluster = cJSON_CreateObject();
    char path[128];

    counters_batch(5);
    counters_batch(3);
    counters_admit_round(7);
    counters_landed_batch(4);
    self = peers_self_json();
    T_EQ_I64(num(self, "batch", "largest"), 5);
    T_EQ_I64(num(self, "admission", "largest"), 7);
    T_ASSERT(non_count(self, path, sizeof path) != NULL);   /* there is something to drop */
    peers_sum(cluster, self);
    peers_sum(cluster, self);
    peers_cluster_tidy(cluster);
    T_EQ_I64(num(cluster, "batch", "batches"), 4);
    T_EQ_I64(num(cluster, "batch", "buyers"), 16);
    T_EQ_I64(num(cluster, "admission", "roundTrips"), 2);
    T_EQ_I64(num(cluster, "admission", "admissions"), 14);
    T_EQ_I64(num(cluster, "consumer", "batches"), 2);
    if (non_count(cluster, path, sizeof path) != NULL)
        fprintf(stderr, "# summed: %s\n", path);
    T_ASSERT(non_count(cluster, path, sizeof path) == NULL);
    cJSON_Delete(self);
    cJSON_Delete(cluster);
}

int main(void)
{
    T_RUN(test_the_sum_adds_counts_and_drops_the_rest);
    return t_done();
}
