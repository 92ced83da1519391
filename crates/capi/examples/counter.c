/*
 * A replicated counter: three replicas in one process on the shm fabric. Every command adds
 * its byte to the counter and replies with the new total; the replicas must agree.
 *
 *   cc -std=c11 counter.c -I crates/capi/include -L DIR -lmicrorep -o counter
 *   ./counter /dev/shm/microrep-counter-demo     (the cluster's shm directory)
 */
#define _POSIX_C_SOURCE 200809L
#include <microrep.h>

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REPLICAS 3
#define COMMANDS 100
#define SUBMITTED 10

struct counter {
  _Atomic uint64_t total; /* read by main while a node thread applies */
  _Atomic int freed;
};

static void apply(void *user, microrep_index index, const uint8_t *command, size_t len, microrep_bytes *reply) {
  (void)index;
  struct counter *c = user;
  uint64_t total = atomic_load(&c->total) + (len > 0 ? command[0] : 0);
  atomic_store(&c->total, total);
  microrep_bytes_append(reply, (const uint8_t *)&total, sizeof total);
}

static void snapshot(void *user, microrep_bytes *out) {
  uint64_t total = atomic_load(&((struct counter *)user)->total);
  microrep_bytes_append(out, (const uint8_t *)&total, sizeof total);
}

static int32_t restore(void *user, const uint8_t *data, size_t len) {
  uint64_t total;
  if (len != sizeof total) return 1;
  memcpy(&total, data, sizeof total);
  atomic_store(&((struct counter *)user)->total, total);
  return 0;
}

static void free_user(void *user) { atomic_store(&((struct counter *)user)->freed, 1); }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void fail(const char *what, microrep_status status) {
  fprintf(stderr, "counter: %s: %s: %s\n", what, microrep_status_name(status), microrep_last_error());
  exit(1);
}

static uint64_t reply_value(const microrep_committed *c) {
  uint64_t v = 0;
  if (c->reply.len == sizeof v) memcpy(&v, c->reply.data, sizeof v);
  return v;
}

/* Proposes at whichever replica leads, following redirects (bounded: 30 s); refusals that wrote
 * nothing retry. Returns the reply and sets *leader to the replica that committed it. */
static uint64_t propose_byte(microrep_node **nodes, int *leader, uint8_t byte) {
  double deadline = now_s() + 30;
  for (;;) {
    microrep_committed committed;
    microrep_status s = microrep_node_propose(nodes[*leader], &byte, 1, &committed);
    if (s == MICROREP_OK) {
      uint64_t v = reply_value(&committed);
      microrep_buffer_free(&committed.reply);
      return v;
    }
    if ((s != MICROREP_NOT_LEADER && s != MICROREP_BACKLOGGED) || now_s() > deadline) fail("propose", s);
    int hint = microrep_node_leader(nodes[*leader]);
    if (s == MICROREP_NOT_LEADER && hint >= 0 && hint < REPLICAS) *leader = hint;
    sched_yield();
  }
}

/* Submits one increment at whichever replica leads, following redirects (bounded: 30 s). */
static microrep_pending *submit_one(microrep_node **nodes, int *leader) {
  double deadline = now_s() + 30;
  for (;;) {
    uint8_t one = 1;
    microrep_pending *pending = NULL;
    microrep_status s = microrep_node_submit(nodes[*leader], &one, 1, &pending);
    if (s == MICROREP_OK) return pending;
    if ((s != MICROREP_NOT_LEADER && s != MICROREP_BACKLOGGED) || now_s() > deadline) fail("submit", s);
    int hint = microrep_node_leader(nodes[*leader]);
    if (s == MICROREP_NOT_LEADER && hint >= 0 && hint < REPLICAS) *leader = hint;
    sched_yield();
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SHM_DIR\n", argv[0]);
    return 2;
  }
  char name[64];
  snprintf(name, sizeof name, "capi-counter-%ld", (long)getpid());
  microrep_config *config = NULL;
  microrep_status s = microrep_config_local(name, REPLICAS, &config);
  if (s != MICROREP_OK) fail("config", s);
  char dir[4096];
  snprintf(dir, sizeof dir, "\"%s\"", argv[1]);
  if ((s = microrep_config_set(config, "cluster.shm_dir", dir)) != MICROREP_OK) fail("shm_dir", s);
  /* A replica descheduled on a busy machine should rarely look dead: an increment whose
   * outcome is unknown after a leader change would leave the expected total unknown. */
  if ((s = microrep_config_set(config, "cluster.timing.heartbeat_us", "10000")) != MICROREP_OK) fail("heartbeat", s);

  static struct counter counters[REPLICAS];
  microrep_node *nodes[REPLICAS];
  for (int id = 0; id < REPLICAS; id++) {
    char value[8];
    snprintf(value, sizeof value, "%d", id);
    if ((s = microrep_config_set(config, "node.id", value)) != MICROREP_OK) fail("node.id", s);
    microrep_state_machine sm = {&counters[id], apply, snapshot, restore, NULL, free_user};
    if ((s = microrep_node_start(config, sm, &nodes[id])) != MICROREP_OK) fail("start", s);
  }
  microrep_config_free(config);

  uint64_t expected = 0;
  int leader = 0;
  for (int i = 1; i <= COMMANDS; i++) {
    expected += (uint64_t)i;
    uint64_t got = propose_byte(nodes, &leader, (uint8_t)i);
    if (got != expected) {
      fprintf(stderr, "counter: reply %llu, expected %llu\n", (unsigned long long)got, (unsigned long long)expected);
      return 1;
    }
  }
  printf("counter: %d proposals committed, total %llu\n", COMMANDS, (unsigned long long)expected);

  /* Submit several without waiting (batched together in handover mode), then poll them. */
  /* A leader change on a busy machine refuses what was not written yet (NOT_LEADER): that
   * increment is submitted again at the new leader. */
  microrep_pending *pending[SUBMITTED];
  for (int i = 0; i < SUBMITTED; i++) pending[i] = submit_one(nodes, &leader);
  int done = 0;
  uint64_t highest = 0;
  double deadline = now_s() + 30;
  while (done < SUBMITTED) {
    for (int i = 0; i < SUBMITTED; i++) {
      if (!pending[i]) continue;
      microrep_committed committed;
      s = microrep_pending_poll(pending[i], &committed);
      if (s == MICROREP_PENDING) continue;
      if (s == MICROREP_NOT_LEADER) {
        microrep_pending_free(pending[i]);
        pending[i] = submit_one(nodes, &leader);
        continue;
      }
      if (s != MICROREP_OK) fail("poll", s);
      if (reply_value(&committed) > highest) highest = reply_value(&committed);
      microrep_buffer_free(&committed.reply);
      microrep_pending_free(pending[i]);
      pending[i] = NULL;
      done++;
    }
    if (now_s() > deadline) fail("poll: no outcome within 30 s", MICROREP_TIMEOUT);
    sched_yield();
  }
  expected += SUBMITTED;
  if (highest != expected) {
    fprintf(stderr, "counter: highest submitted reply %llu, expected %llu\n", (unsigned long long)highest,
            (unsigned long long)expected);
    return 1;
  }
  printf("counter: %d submissions polled to commit, total %llu\n", SUBMITTED, (unsigned long long)expected);

  /* A follower refuses proposals; its message names the leader it believes in. */
  int follower = (leader + 1) % REPLICAS;
  for (int id = 0; id < REPLICAS; id++)
    if (microrep_node_leader(nodes[id]) != id) follower = id;
  uint8_t byte = 1;
  microrep_committed ignored;
  s = microrep_node_propose(nodes[follower], &byte, 1, &ignored);
  printf("counter: a follower says %s: %.14s\n", microrep_status_name(s), microrep_last_error());

  /* Followers apply what the leader committed (bounded wait). */
  deadline = now_s() + 30;
  for (int id = 0; id < REPLICAS; id++) {
    while (atomic_load(&counters[id].total) != expected) {
      if (now_s() > deadline) {
        fprintf(stderr, "counter: replica %d stuck at %llu\n", id, (unsigned long long)atomic_load(&counters[id].total));
        return 1;
      }
      sched_yield();
    }
  }
  printf("counter: every replica at %llu\n", (unsigned long long)expected);

  for (int id = 0; id < REPLICAS; id++) microrep_node_free(nodes[id]);
  for (int id = 0; id < REPLICAS; id++) {
    if (!atomic_load(&counters[id].freed)) {
      fprintf(stderr, "counter: replica %d's user context was not released\n", id);
      return 1;
    }
  }
  printf("counter: nodes stopped, user contexts released\n");
  return 0;
}
