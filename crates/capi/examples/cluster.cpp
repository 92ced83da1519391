// A replicated key-value map in C++: three replicas in one process on the shm fabric, with
// small RAII wrappers over the C ABI. It follows the leader, shows the error model, and stops
// a follower, writes past its log, and restarts it with an empty map: the follower catches up
// through a snapshot (the restore callback).
//
//   c++ -std=c++17 cluster.cpp -I crates/capi/include -L DIR -lmicrorep -o cluster
//   ./cluster /dev/shm/microrep-cluster-demo     (the cluster's shm directory)
#include <microrep.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

// A failed call as an exception, with the library's message.
struct Error : std::runtime_error {
  microrep_status status;
  Error(const std::string &what, microrep_status s)
      : std::runtime_error(what + ": " + microrep_status_name(s) + ": " + microrep_last_error()), status(s) {}
};

void check(microrep_status s, const char *what) {
  if (s != MICROREP_OK) throw Error(what, s);
}

// Commands: "SET key value" replies "OK"; "GET key" replies the value (or "").
class Store {
 public:
  std::string apply(const std::string &command) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (command.rfind("SET ", 0) == 0) {
      auto space = command.find(' ', 4);
      map_[command.substr(4, space - 4)] = space == std::string::npos ? "" : command.substr(space + 1);
      return "OK";
    }
    if (command.rfind("GET ", 0) == 0) {
      auto it = map_.find(command.substr(4));
      return it == map_.end() ? "" : it->second;
    }
    return "ERR unknown command";
  }
  // Snapshot format: key NUL value NUL, repeated.
  std::string snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string out;
    for (const auto &kv : map_) out += kv.first + '\0' + kv.second + '\0';
    return out;
  }
  bool restore(const std::string &data) {
    std::map<std::string, std::string> map;
    size_t at = 0;
    while (at < data.size()) {
      size_t k = data.find('\0', at);
      size_t v = k == std::string::npos ? k : data.find('\0', k + 1);
      if (v == std::string::npos) return false;  // refused: the state stays as it was
      map[data.substr(at, k - at)] = data.substr(k + 1, v - k - 1);
      at = v + 1;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    map_.swap(map);
    restores++;
    return true;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return map_.size();
  }
  std::atomic<int> restores{0};

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::string> map_;
};

// The callbacks: no exception may leave them (the library is C).
extern "C" void store_apply(void *user, microrep_index, const uint8_t *cmd, size_t len, microrep_bytes *reply) {
  try {
    std::string r = static_cast<Store *>(user)->apply(std::string(reinterpret_cast<const char *>(cmd), len));
    microrep_bytes_append(reply, reinterpret_cast<const uint8_t *>(r.data()), r.size());
  } catch (...) {
    std::terminate();
  }
}
extern "C" void store_snapshot(void *user, microrep_bytes *out) {
  std::string s = static_cast<Store *>(user)->snapshot();
  microrep_bytes_append(out, reinterpret_cast<const uint8_t *>(s.data()), s.size());
}
extern "C" int32_t store_restore(void *user, const uint8_t *data, size_t len) {
  return static_cast<Store *>(user)->restore(std::string(reinterpret_cast<const char *>(data), len)) ? 0 : 1;
}

struct ConfigDeleter {
  void operator()(microrep_config *c) const { microrep_config_free(c); }
};
struct NodeDeleter {
  void operator()(microrep_node *n) const { microrep_node_free(n); }
};
using Config = std::unique_ptr<microrep_config, ConfigDeleter>;
using Node = std::unique_ptr<microrep_node, NodeDeleter>;

Node start(microrep_config *config, int id, Store *store) {
  check(microrep_config_set(config, "node.id", std::to_string(id).c_str()), "node.id");
  microrep_state_machine sm{store, store_apply, store_snapshot, store_restore, nullptr, nullptr};
  microrep_node *node = nullptr;
  check(microrep_node_start(config, sm, &node), "start");
  return Node(node);
}

// Proposes at whichever live replica leads, following redirects (bounded: 30 s). SET and GET
// are idempotent, so a command whose outcome is unknown (the leader changed while it was
// replicated) is simply proposed again.
std::string propose(std::vector<Node> &nodes, const std::string &command) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int at = 0;
  for (;;) {
    if (!nodes[at]) at = (at + 1) % static_cast<int>(nodes.size());
    microrep_committed c;
    auto s = microrep_node_propose(nodes[at].get(), reinterpret_cast<const uint8_t *>(command.data()),
                                   command.size(), &c);
    if (s == MICROREP_OK) {
      std::string reply(reinterpret_cast<const char *>(c.reply.data), c.reply.len);
      microrep_buffer_free(&c.reply);
      return reply;
    }
    bool retry = s == MICROREP_NOT_LEADER || s == MICROREP_BACKLOGGED || s == MICROREP_UNKNOWN || s == MICROREP_TIMEOUT;
    if (!retry || std::chrono::steady_clock::now() > deadline)
      throw Error("propose " + command, s);
    int leader = microrep_node_leader(nodes[at].get());
    if (s == MICROREP_NOT_LEADER && leader >= 0 && nodes[leader]) at = leader;
    std::this_thread::yield();
  }
}

void wait_until(const char *what, const std::function<bool()> &done) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error(std::string("timed out: ") + what);
    std::this_thread::yield();
  }
}

}  // namespace

int main(int argc, char **argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SHM_DIR\n", argv[0]);
    return 2;
  }
  microrep_config *raw = nullptr;
  std::string name = "capi-cluster-" + std::to_string(getpid());
  check(microrep_config_local(name.c_str(), 3, &raw), "config");
  Config config(raw);
  check(microrep_config_set(raw, "cluster.shm_dir", ("\"" + std::string(argv[1]) + "\"").c_str()), "shm_dir");
  check(microrep_config_set(raw, "cluster.timing.heartbeat_us", "10000"), "heartbeat");
  // A small log, so that a replica away for 200 commands must catch up from a snapshot.
  check(microrep_config_set(raw, "cluster.log.snapshot_every", "16"), "snapshot_every");
  check(microrep_config_set(raw, "cluster.log.slots", "64"), "slots");

  // The error model: a refused setting names its key, and the config is unchanged.
  auto s = microrep_config_set(raw, "cluster.log.slot_bytes", "\"big\"");
  std::printf("cluster: bad setting: %s: %s\n", microrep_status_name(s), microrep_last_error());

  Store stores[3];
  std::vector<Node> nodes;
  for (int id = 0; id < 3; id++) nodes.push_back(start(raw, id, &stores[id]));

  for (int i = 0; i < 50; i++) propose(nodes, "SET k" + std::to_string(i) + " v" + std::to_string(i));
  std::printf("cluster: GET k7 -> %s\n", propose(nodes, "GET k7").c_str());

  std::string huge(1 << 16, 'x');
  try {
    propose(nodes, "SET huge " + huge);
  } catch (const Error &e) {
    std::printf("cluster: oversized command: %s\n", microrep_status_name(e.status));
  }

  // Stop follower 2, write well past its log, restart it with an empty store.
  nodes[2].reset();
  for (int i = 0; i < 200; i++) propose(nodes, "SET j" + std::to_string(i) + " w" + std::to_string(i));
  Store fresh;
  nodes[2] = start(raw, 2, &fresh);
  wait_until("the restarted replica catches up", [&] { return fresh.size() == 250; });
  std::printf("cluster: restarted replica holds %zu keys, restored from %s snapshot\n", fresh.size(),
              fresh.restores > 0 ? "a" : "no");
  wait_until("the replicas converge", [&] { return stores[0].snapshot() == fresh.snapshot(); });
  std::printf("cluster: replicas 0 and 2 agree\n");
  nodes.clear();
  std::printf("cluster: stopped\n");
  return 0;
} catch (const std::exception &e) {
  std::fprintf(stderr, "cluster: %s\n", e.what());
  return 1;
}
