// SPDX-License-Identifier: Apache-2.0
// kvpager-sim --disaggregated: the prefill and decode instances, their transfers and the loop that runs them on
// simulated clocks (disaggregated.hpp says what it does). A translation unit of its own: it instantiates the
// scheduler again over each composition (and over kv_groups_swap_cache for --layers) and the connector over each
// transport, apart from main.cpp's runs.

#include "disaggregated.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <kvpager/cache/compositions.hpp>
#include <kvpager/kernels/step_executor.hpp>
#include <kvpager/sched/scheduler.hpp>
#include <kvpager/sizing/tensor_parallel.hpp>
#include <kvpager/transfer/inproc_transport.hpp>
#include <kvpager/transfer/kv_connector.hpp>
#if KVPAGER_SIM_HAS_UCX
#include <kvpager/transfer/ucx_transport.hpp>
#endif

namespace kvsim {
namespace {

using kvpager::block_id;
using kvpager::seq_id;
using kvpager::token_id;
using wall_clock = std::chrono::steady_clock;

/// One K or V row of one head (head_dim fp16 elements) as 64-bit words.
constexpr std::size_t row_words =
    static_cast<std::size_t>(disagg_shape::head_dim) * kvpager::elem_bytes(disagg_shape::dtype) / sizeof(std::uint64_t);
static_assert(row_words * sizeof(std::uint64_t) ==
              static_cast<std::size_t>(disagg_shape::head_dim) * kvpager::elem_bytes(disagg_shape::dtype));
using kv_row = std::array<std::uint64_t, row_words>;

/// What computing token `tok` at position `pos` writes into (layer, K or V, head): a stream of words seeded by the
/// five. The content is only compared, never computed with, so any bits do; a prefix-cache hit (the same tokens at
/// the same positions) serves the same rows, as a real model's KV.
kv_row expected_row(token_id tok, std::int64_t pos, std::int32_t layer, std::int32_t kv, std::int32_t head) noexcept {
  const std::uint64_t t = (std::uint64_t{static_cast<std::uint32_t>(tok)} << 32) | static_cast<std::uint32_t>(pos);
  const auto where = static_cast<std::uint64_t>((layer * 2 + kv) * disagg_shape::kv_heads + head);
  std::uint64_t x = splitmix64(splitmix64(t) ^ (where << 40) ^ where);
  kv_row row{};
  for (std::uint64_t& w : row) {
    w = x;
    x += 0x9E3779B97F4A7C15ULL;
  }
  return row;
}

/// One instance: its cache, scheduler and pools (host_kv_pools: one pool per layer place and the host pool, moved by
/// each step's plan through the shipped block-move kernels), registered with its transport. Not movable: the
/// scheduler holds the cache, the connector the pools' addresses.
///
/// The transfer's layers (kv_side::num_layers): layer k is read through table `layer_table[k]` and lies in pool
/// `layer_pool[k]`. One group: layer k in table 0 and pool k. KV cache groups: every group's first layers in group
/// order, each in its group's table and the pool of its place in the group's block (a block holds one group's
/// layers, so the groups' layers at one place share that pool, as vLLM's groups share their layers' tensors).
template <class Cache>
struct instance {
  static constexpr bool grouped = requires(const Cache& c) { c.num_groups(); };
  /// The entry that holds nothing: a window's released entries (no_block without groups: none).
  static constexpr block_id null = [] {
    if constexpr (grouped) return Cache::null_block;
    return kvpager::no_block;
  }();

  instance(Cache c, kvpager::host_kv_pools p, const kvpager::scheduler_config& cfg, const kvpager::kv_side& s,
           std::vector<std::int32_t> tables_of_layers, std::vector<std::int32_t> pools_of_layers)
      : cache(std::move(c)),
        pools(std::move(p)),
        sched(cache, cfg),
        side(s),
        layer_table(std::move(tables_of_layers)),
        layer_pool(std::move(pools_of_layers)) {
    if constexpr (grouped) tables = cache.num_tables();
    table_layers.resize(static_cast<std::size_t>(tables));
    for (std::size_t k = 0; k < layer_table.size(); ++k)
      table_layers[static_cast<std::size_t>(layer_table[k])].push_back(static_cast<std::int32_t>(k));
  }
  instance(const instance&) = delete;
  instance& operator=(const instance&) = delete;

  Cache cache;
  kvpager::host_kv_pools pools;
  kvpager::scheduler<Cache> sched;
  kvpager::kv_side side;
  std::vector<std::int32_t> layer_table, layer_pool;  ///< per transfer layer
  std::vector<std::vector<std::int32_t>> table_layers;  ///< per table: its transfer layers
  std::int32_t tables = 1;
  std::vector<kvpager::mem_handle> mems;  ///< per transfer layer: its pool's registration
  double clock = 0;  ///< simulated seconds
  std::int64_t steps = 0;

  [[nodiscard]] std::int32_t block_size() const noexcept { return cache.config().block_size; }

  /// The connector's view of the groups: each transfer layer's table and the null block (one table: none).
  [[nodiscard]] kvpager::kv_groups groups() const noexcept {
    if constexpr (grouped) return kvpager::kv_groups{layer_table, null};
    return kvpager::kv_groups{};
  }

  /// Sequence `id`'s block tables, one per table; false when the cache does not have it.
  bool tables_of(seq_id id, std::vector<std::span<const block_id>>& out) const { return cache.block_tables(id, out).ok(); }

  /// The bytes of (transfer layer, block, K or V, head, token in block), one row.
  [[nodiscard]] std::byte* row(std::int32_t layer, block_id b, std::int32_t kv, std::int32_t head, std::int32_t in) {
    return pools.device_bytes(layer_pool[static_cast<std::size_t>(layer)]).data() + side.offset(layer, b, kv, head, in);
  }

  /// Writes what computing token `tok` at position `pos` writes into the layers of table `t`, at `slot` (block x
  /// block_size + offset in that table).
  void write(std::int32_t t, std::int64_t slot, token_id tok, std::int64_t pos) {
    const std::int32_t bs = block_size();
    const auto b = static_cast<block_id>(slot / bs);
    const auto in = static_cast<std::int32_t>(slot % bs);
    for (const std::int32_t l : table_layers[static_cast<std::size_t>(t)])
      for (std::int32_t kv = 0; kv < 2; ++kv)
        for (std::int32_t h = 0; h < disagg_shape::kv_heads; ++h) {
          const kv_row r = expected_row(tok, pos, l, kv, h);
          std::memcpy(row(l, b, kv, h, in), r.data(), sizeof r);
        }
  }

  /// No sequence, used block or swapped sequence left, every usable block available.
  [[nodiscard]] bool empty() const {
    const kvpager::cache_stats cs = cache.stats();
    return cs.sequences == 0 && cs.used == 0 && cs.swapped == 0 && cache.available_blocks() == cs.total &&
           sched.held().empty();
  }

  [[nodiscard]] disagg_instance figures() const {
    disagg_instance f;
    f.steps = steps;
    f.simulated_s = clock;
    const kvpager::scheduler_stats st = sched.stats();
    f.prefix_hit_rate = st.prefix.query_tokens > 0
                            ? static_cast<double>(st.prefix.hit_tokens) / static_cast<double>(st.prefix.query_tokens)
                            : 0.0;
    f.preemptions = st.preempted_swap + st.preempted_recompute;
    f.swap_outs = cache.stats().swap_outs;
    f.pools_empty = empty();
    return f;
  }
};

/// Creates an instance over composition `Cache` (with groups: over o.groups in vLLM's conventions) with the shape's
/// pools. "" or what failed.
template <class Cache>
std::string make_instance(const disagg_options& o, const char* role, const kvpager::scheduler_config& sched,
                          std::unique_ptr<instance<Cache>>& out) {
  kvpager::scheduler_config sc = sched;
  sc.export_slot_mapping = true;  // where the prefill instance writes each computed token's KV
  kvpager::cache_config cc = o.cache;
  cc.num_kv_heads = disagg_shape::kv_heads;
  cc.head_dim = disagg_shape::head_dim;
  cc.dtype = disagg_shape::dtype;
  std::vector<std::int32_t> layer_table, layer_pool;
  auto cache = [&] {
    if constexpr (instance<Cache>::grouped) {
      for (std::size_t g = 0; g < o.groups.size(); ++g)
        for (std::int32_t j = 0; j < std::min(o.shape.layers, o.group_layers[g]); ++j) {
          layer_table.push_back(static_cast<std::int32_t>(g));
          layer_pool.push_back(j);
        }
      return Cache::create(cc, o.groups, {kvpager::hybrid_conventions::vllm});
    } else {
      for (std::int32_t j = 0; j < o.shape.layers; ++j) {
        layer_table.push_back(0);
        layer_pool.push_back(j);
      }
      return Cache::create(cc, kvpager::can_implement);
    }
  }();
  if (!cache) return std::string(role) + ": cannot create the cache: " + cache.error().message();
  const kvpager::kv_geometry g = cache->geometry();
  // The executor moves every pool of a block: with groups, a block belongs to one group, whose layers are there.
  auto pools = kvpager::host_kv_pools::create(g, static_cast<std::int32_t>(cc.host_pool_blocks()), o.shape.layers);
  if (!pools) return std::string(role) + ": cannot create the KV pools: " + pools.error().message();
  const auto rank = kvpager::rank_layout(g, disagg_shape::q_heads, 1, 0);
  if (!rank) return std::string(role) + ": the KV layout: " + rank.error().message();
  const auto layers = static_cast<std::int32_t>(layer_table.size());
  out = std::make_unique<instance<Cache>>(std::move(*cache), std::move(*pools), sc,
                                          kvpager::kv_side{*rank, layers, kvpager::kv_pool_layout::per_layer},
                                          std::move(layer_table), std::move(layer_pool));
  if (out->tables != (o.groups.empty() ? 1 : static_cast<std::int32_t>(o.groups.size())))
    return std::string(role) + ": the cache has a table per unit of a group (the pools map one table per group)";
  return "";
}

/// The two instances' transports, connected: the prefill instance's (p) and the decode instance's (d).
template <class T>
struct link;

template <>
struct link<kvpager::inproc_transport> {
  kvpager::inproc_transport p, d;
  kvpager::peer_handle to_d = -1, to_p = -1;
  std::string open(const disagg_options&) {
    std::tie(to_d, to_p) = kvpager::inproc_transport::connect(p, d);
    return "";
  }
  kvpager::inproc_transport& prefill() noexcept { return p; }
  kvpager::inproc_transport& decode() noexcept { return d; }
  /// A call on one side's transport (or connector half).
  template <class F>
  decltype(auto) on_prefill(F&& f) {
    return f();
  }
  template <class F>
  decltype(auto) on_decode(F&& f) {
    return f();
  }
  void progress() noexcept {}
  /// The test hook: the reads started from now on fail (or no longer do).
  void fail_reads(bool on) noexcept {
    d.set_read_fault(on ? kvpager::inproc_transport::read_fault::fail : kvpager::inproc_transport::read_fault::none);
  }
};

#if KVPAGER_SIM_HAS_UCX
template <>
struct link<kvpager::ucx_transport> {
  std::optional<kvpager::ucx_transport> p, d;
  kvpager::peer_handle to_d = -1, to_p = -1;
  // A call on one transport may wait for the other side (a send until its connection is wired, over TCP): while the
  // loop is in one, a thread of its own progresses the other. Each transport is used by one thread at a time: every
  // call holds its transport's mutex, and the pump progresses only a transport whose mutex it gets.
  std::mutex pm, dm;
  std::atomic<bool> stop{false};
  std::thread pump;

  link() = default;
  link(const link&) = delete;
  link& operator=(const link&) = delete;
  ~link() {
    stop = true;
    if (pump.joinable()) pump.join();
  }

  /// Both transports over the loopback: the prefill side listens on a free port of 127.0.0.1, the decode side
  /// connects. Every wait is bounded by the timeout.
  std::string open(const disagg_options& o) {
    const kvpager::ucx_options uo{o.timeout, o.timeout, true};
    auto tp = kvpager::ucx_transport::create(uo);
    auto td = kvpager::ucx_transport::create(uo);
    if (!tp || !td) return std::string("UCX: ") + (!tp ? tp.error().message() : td.error().message());
    p.emplace(std::move(*tp));
    d.emplace(std::move(*td));
    const auto port = p->listen("127.0.0.1", 0);
    if (!port) return std::string("UCX: listening on 127.0.0.1: ") + port.error().message();
    // accept() and connect() each wait for the other side's answer: the prefill side accepts on a thread of its own
    // for the set-up only (each transport is used by one thread at a time; the join hands it back).
    std::optional<kvpager::result<kvpager::peer_handle>> accepted;
    std::thread acceptor([&] { accepted.emplace(p->accept(o.timeout)); });
    const auto connected = d->connect("127.0.0.1", *port);
    acceptor.join();
    if (!connected) return "UCX: connecting to 127.0.0.1:" + std::to_string(*port) + ": " + connected.error().message();
    if (!*accepted) return std::string("UCX: accepting on 127.0.0.1: ") + accepted->error().message();
    to_d = **accepted;
    to_p = *connected;
    pump = std::thread([this] {
      while (!stop.load()) {
        for (auto [m, t] : {std::pair{&pm, &*p}, std::pair{&dm, &*d}})
          if (m->try_lock()) {
            t->progress();
            m->unlock();
          }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
    return "";
  }
  kvpager::ucx_transport& prefill() noexcept { return *p; }
  kvpager::ucx_transport& decode() noexcept { return *d; }
  template <class F>
  decltype(auto) on_prefill(F&& f) {
    const std::lock_guard<std::mutex> hold(pm);
    return f();
  }
  template <class F>
  decltype(auto) on_decode(F&& f) {
    const std::lock_guard<std::mutex> hold(dm);
    return f();
  }
  /// Both workers progress: over TCP a read from the prefill instance's pools needs its side to answer.
  void progress() {
    on_prefill([&] { p->progress(); });
    on_decode([&] { d->progress(); });
  }
  void fail_reads(bool) noexcept {}
};
#endif

/// The run: both instances, the connector's halves between them, and the requests' state on each side.
template <class Cache, class T>
class disagg_run {
 public:
  disagg_run(const workload& w, const disagg_options& o, disagg_summary& s) : w_(w), o_(o), s_(s) {}

  std::string run() {
    for (std::size_t i = 0; i < w_.requests.size(); ++i) index_[w_.requests[i].id] = i;
    if (index_.size() != w_.requests.size()) return "two requests of the workload have the same id";
    s_.per_request.resize(w_.requests.size());
    for (std::size_t i = 0; i < w_.requests.size(); ++i) s_.per_request[i].id = w_.requests[i].id;
    kvpager::scheduler_config prefill_sched = o_.sched;
    if (o_.prefill_token_budget > 0) prefill_sched.max_num_batched_tokens = o_.prefill_token_budget;
    if (std::string e = make_instance<Cache>(o_, "prefill instance", prefill_sched, P_); !e.empty()) return e;
    if (std::string e = make_instance<Cache>(o_, "decode instance", o_.sched, D_); !e.empty()) return e;
    if (std::string e = link_.open(o_); !e.empty()) return e;
    if (std::string e = register_pools(*P_, true); !e.empty()) return e;
    if (std::string e = register_pools(*D_, false); !e.empty()) return e;
    auto sender = kvpager::kv_sender<T>::create(link_.prefill(), P_->side, P_->mems, P_->groups());
    if (!sender) return std::string("kv_sender: ") + sender.error().message();
    sender_.emplace(std::move(*sender));
    auto receiver =
        kvpager::kv_receiver<T>::create(link_.decode(), link_.to_p, D_->side, D_->mems, o_.timeout, D_->groups());
    if (!receiver) return std::string("kv_receiver: ") + receiver.error().message();
    receiver_.emplace(std::move(*receiver));
    if (std::string e = loop(); !e.empty()) return e;
    finish_figures();
    return "";
  }

 private:
  struct live {  // a sample on the decode instance
    std::uint64_t gen_seed = 0;
    std::int32_t outputs = 0;
    std::int32_t max_new = 1;
    const sim_request* parent = nullptr;  // children to fork after the first output
    std::size_t index = 0;                // its request in the workload
  };
  struct flight {  // a read started and not ended
    seq_id id = 0;
    std::vector<std::vector<block_id>> tables;  // the request's tables on the decode instance
    std::int32_t first = 0, count = 0;
    wall_clock::time_point started;
  };
  struct arrived {  // a read that ended: reported to the decode cache once its clock is there
    seq_id id = 0;
    bool ok = false;
    double at = 0;
  };

  [[nodiscard]] const sim_request& request(seq_id id) const { return w_.requests[index_.at(id)]; }
  [[nodiscard]] static std::int64_t samples(const sim_request& r) {
    return 1 + static_cast<std::int64_t>(r.child_ids.size());
  }
  [[nodiscard]] double arrival_s(std::size_t i) const { return w_.requests[i].arrival * o_.step_s; }
  [[nodiscard]] double step_s(std::int64_t prompt_tokens) const {
    return o_.step_s + static_cast<double>(prompt_tokens) * o_.prefill_s_per_token;
  }
  void reject(std::int64_t n, const std::string& why) {
    s_.rejected += n;
    s_.rejected_reasons[why] += n;
  }

  /// Spins (progressing both transports) until `done()` or the timeout: whether it came.
  template <class F>
  bool wait_for(F&& done) {
    const auto until = wall_clock::now() + o_.timeout;
    while (!done()) {
      if (wall_clock::now() >= until) return false;
      link_.progress();
      std::this_thread::yield();
    }
    return true;
  }

  // ---------------------------------------------------------------------------------------------- the loop

  /// The instance whose next event comes first runs: a step when it has work, else the arrivals, offers, reads and
  /// done messages due at that time. Ends when neither has anything left.
  std::string loop() {
    constexpr double never = std::numeric_limits<double>::infinity();
    const std::int64_t step_limit = std::int64_t{1} << 40;
    for (;;) {
      poll_done();
      const kvpager::scheduler_stats ps = P_->sched.stats();
      double p_next = ps.running + ps.waiting + ps.swapped + ps.loading > 0 ? P_->clock : never;
      if (next_ < w_.requests.size()) p_next = std::min(p_next, std::max(P_->clock, arrival_s(next_)));
      for (const auto& [id, at] : done_sent_) p_next = std::min(p_next, std::max(P_->clock, at));
      const kvpager::scheduler_stats ds = D_->sched.stats();
      double d_next =
          ds.running + ds.waiting + ds.swapped > 0 || !D_->sched.pending_forks().empty() ? D_->clock : never;
      if (!to_offer_.empty()) d_next = std::min(d_next, std::max(D_->clock, to_offer_.front().second));
      for (const arrived& a : arrived_) d_next = std::min(d_next, std::max(D_->clock, a.at));
      if (p_next == never && d_next == never) return "";
      if (p_next <= d_next) {
        P_->clock = p_next;
        if (std::string e = prefill_turn(); !e.empty()) return e;
      } else {
        D_->clock = d_next;
        if (std::string e = decode_turn(); !e.empty()) return e;
      }
      if (P_->steps + D_->steps > step_limit) return "the run did not end within 2^40 steps";
    }
  }

  // ---------------------------------------------------------------------------------------------- prefill instance

  /// Arrivals and releases due, then a step: the plan's moves, each computed token's KV written, and every request
  /// whose prompt is computed completed with one token (held) and queued to be offered when the step ends.
  std::string prefill_turn() {
    instance<Cache>& P = *P_;
    while (next_ < w_.requests.size() && arrival_s(next_) <= P.clock) {
      const sim_request& r = w_.requests[next_++];
      const auto a = P.sched.add_request(r.id, r.prompt, 0);
      if (!a || *a == kvpager::admission::never) {
        reject(samples(r), !a ? std::string("prefill: ") + a.error().message()
                              : std::string("prefill: the prompt does not fit the KV cache"));
        continue;
      }
      if (const kvpager::status st = P.sched.hold(r.id); !st) return std::string("prefill: hold: ") + st.message();
    }
    if (std::string e = release_due(); !e.empty()) return e;
    const kvpager::scheduler_stats ps = P.sched.stats();
    if (ps.running + ps.waiting + ps.swapped + ps.loading == 0) return "";
    const kvpager::step_output& out = P.sched.schedule();
    if (const kvpager::status st = P.pools.executor().run_plan(*out.plan); !st)
      return std::string("prefill: step_executor::run_plan: ") + st.message();
    // The step's slots, table-major: table t's at [t x n, (t + 1) x n), one per scheduled token.
    std::int64_t prompt_tokens = 0, n = 0;
    for (const kvpager::scheduled_sequence& e : out.scheduled) n += e.num_tokens;
    if (static_cast<std::int64_t>(out.slot_mapping.size()) != n * P.tables)
      return "prefill: the step's slot mapping has " + std::to_string(out.slot_mapping.size()) + " slots for " +
             std::to_string(n) + " tokens in " + std::to_string(P.tables) + " tables";
    std::int64_t k = 0;
    for (const kvpager::scheduled_sequence& e : out.scheduled) {
      const sim_request& r = request(e.id);
      for (std::int32_t p = e.start; p < e.start + e.num_tokens; ++p, ++k)
        for (std::int32_t t = 0; t < P.tables; ++t) {
          const std::int64_t slot = out.slot_mapping[static_cast<std::size_t>(t * n + k)];
          if (slot >= 0) P.write(t, slot, r.prompt[static_cast<std::size_t>(p)], p);
        }
      if (e.prefill) prompt_tokens += e.num_tokens;
    }
    const double end = P.clock + step_s(prompt_tokens);
    for (const kvpager::finished_request& f : out.finished)
      reject(samples(request(f.id)), std::string("prefill: ") + kvpager::to_string(f.reason));
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const kvpager::scheduled_sequence e = out.scheduled[i];
      if (!e.last_chunk) continue;
      const sim_request& r = request(e.id);
      if (const kvpager::status st = P.sched.complete_scheduled(i, token_of(r.gen_seed, 0), true); !st)
        return std::string("prefill: complete: ") + st.message();
      to_offer_.emplace_back(e.id, end);
    }
    P.clock = end;
    ++P.steps;
    return "";
  }

  /// Done messages that have come (read or declined: the request's blocks may go).
  void poll_done() {
    std::vector<seq_id> done;
    const kvpager::status st = link_.on_prefill([&] { return sender_->poll(link_.to_d, done); });
    if (!st && st.code() == kvpager::errc::transport_error) link_gone();
    done_got_.insert(done.begin(), done.end());
  }

  /// Releases the requests whose done message the decode instance sent by the prefill clock (UCX: waits for the
  /// message to come in).
  std::string release_due() {
    if (gone_) done_sent_.clear();  // link_gone released them
    for (std::size_t i = 0; i < done_sent_.size();) {
      const auto [id, at] = done_sent_[i];
      if (at > P_->clock) {
        ++i;
        continue;
      }
      if (!wait_for([&] {
            poll_done();
            return gone_ || done_got_.count(id) > 0;
          }))
        return "the prefill instance did not get the done message of request " + std::to_string(id) +
               " within the timeout";
      if (gone_) return "";  // link_gone released everything
      done_got_.erase(id);
      done_sent_.erase(done_sent_.begin() + static_cast<std::ptrdiff_t>(i));
      if (const kvpager::status st = P_->sched.release(id); !st)
        return "prefill: release(" + std::to_string(id) + "): " + st.message();
    }
    return "";
  }

  /// The connection is gone (UCX: a peer error, a read past the timeout; the test hook's close), as either side's
  /// transport first says: nothing more is offered, everything held is released, and the decode instance computes
  /// from the prompt what it was offered and had not received or read, and what comes after.
  void link_gone() {
    if (gone_) return;
    gone_ = true;
    s_.link_lost = true;
    const std::vector<seq_id> held(P_->sched.held().begin(), P_->sched.held().end());
    for (const seq_id id : held)
      if (P_->sched.release(id)) ++s_.released_on_loss;
    done_sent_.clear();
    for (const seq_id id : sent_) {
      ++s_.recomputed_locally;
      admit(id, 0);
    }
    sent_.clear();
  }

  // ---------------------------------------------------------------------------------------------- decode instance

  /// Offers due (sent, then taken as they arrive and admitted with external tokens), reads arrived by now reported
  /// to the cache, then a step: the plan's moves, the reads of the requests it admitted (started and waited for in
  /// wall-clock time, each checked as it ends), offers it did not need declined, and each sample's next token.
  std::string decode_turn() {
    instance<Cache>& D = *D_;
    admitted_ = false;
    while (!to_offer_.empty() && to_offer_.front().second <= D.clock) {
      const seq_id id = to_offer_.front().first;
      to_offer_.pop_front();
      if (std::string e = offer(id); !e.empty()) return e;
    }
    // The prefill instance takes its done messages meanwhile: its transport may be the one that saw the connection
    // go (then the offers never come).
    if (!sent_.empty() && !wait_for([&] {
          receive_offers();
          poll_done();
          return gone_ || sent_.empty() || !error_.empty();
        }))
      return std::to_string(sent_.size()) + " offers did not reach the decode instance within the timeout";
    if (!error_.empty()) return error_;
    bool reported = false;
    for (std::size_t i = 0; i < arrived_.size();) {
      if (arrived_[i].at > D.clock) {
        ++i;
        continue;
      }
      if (const kvpager::status st = D.cache.complete_external(arrived_[i].id, arrived_[i].ok); !st)
        return "decode: complete_external(" + std::to_string(arrived_[i].id) + "): " + st.message();
      arrived_.erase(arrived_.begin() + static_cast<std::ptrdiff_t>(i));
      reported = true;
    }
    const kvpager::scheduler_stats ds = D.sched.stats();
    if (ds.running + ds.waiting + ds.swapped == 0 && D.sched.pending_forks().empty() && !reported && !admitted_)
      return "";
    const kvpager::step_output& out = D.sched.schedule();
    if (const kvpager::status st = D.pools.executor().run_plan(*out.plan); !st)
      return std::string("decode: step_executor::run_plan: ") + st.message();
    std::int64_t prompt_tokens = 0;
    for (const kvpager::scheduled_sequence& e : out.scheduled)
      if (e.prefill) prompt_tokens += e.num_tokens;
    const double end = D.clock + step_s(prompt_tokens);
    if (std::string e = read(out); !e.empty()) return e;
    // An offered request admitted without waiting (its own prefix cache had those blocks, or the prompt has no full
    // block to read) computes here: the prefill instance need not hold it any longer.
    for (const kvpager::scheduled_sequence& e : out.scheduled)
      if (open_.erase(e.id) > 0) decline(e.id);
    for (const kvpager::finished_request& f : out.finished) {
      if (const auto it = live_.find(f.id); it != live_.end()) {
        reject(it->second.parent != nullptr ? samples(*it->second.parent) : 1,
               std::string("decode: ") + kvpager::to_string(f.reason));
        live_.erase(it);
      }
      if (open_.erase(f.id) > 0) decline(f.id);
    }
    for (const seq_id c : out.dropped_forks) {
      reject(1, "decode: fork dropped (its parent no longer ran)");
      live_.erase(c);
    }
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const kvpager::scheduled_sequence& e = out.scheduled[i];
      if (!e.last_chunk) continue;
      const auto it = live_.find(e.id);
      if (it == live_.end()) continue;
      live& st = it->second;
      const kvpager::token_id tok = token_of(st.gen_seed, static_cast<std::uint64_t>(st.outputs));
      ++st.outputs;
      // A fork child starts with the shared first token: outputs 1 here is a request's first sample.
      if (st.outputs == 1) s_.per_request[st.index].ttft_s = end - arrival_s(st.index);
      const bool fin = st.outputs >= st.max_new;
      if (!D.sched.complete_scheduled(i, tok, fin)) continue;
      const sim_request* parent = st.parent;
      const std::int32_t outputs = st.outputs;
      const std::size_t index = st.index;
      st.parent = nullptr;
      if (fin) {
        ++s_.finished;
        s_.output_tokens += outputs;
        live_.erase(it);
      }
      if (parent == nullptr) continue;
      // Parallel sampling as in the paged run: the other samples fork from the first once it has its first token.
      for (std::size_t c = 0; c < parent->child_ids.size(); ++c) {
        if (fin || !D.sched.fork(e.id, parent->child_ids[c])) {
          ++s_.finished;  // a one-token request: its samples are the same token, done
          s_.output_tokens += outputs;
          continue;
        }
        live_[parent->child_ids[c]] = {parent->child_seeds[c], 1, parent->max_new, nullptr, index};
      }
    }
    D.clock = end;
    ++D.steps;
    if (o_.progress && D.steps % 50 == 0) o_.progress(D.steps, s_.finished + s_.rejected, s_.samples);
    return "";
  }

  /// Offers request `id` (held on the prefill instance, its prompt computed), or, once the link is gone, releases
  /// it and computes it on the decode instance.
  std::string offer(seq_id id) {
    const sim_request& r = request(id);
    if (!gone_) {
      std::vector<std::span<const block_id>> tables;
      if (!P_->tables_of(id, tables)) return "prefill: block_table(" + std::to_string(id) + "): the cache lost it";
      maybe_corrupt(r, tables[0]);
      const auto computed = static_cast<std::int64_t>(r.prompt.size());
      const kvpager::status st =
          link_.on_prefill([&] { return sender_->offer(link_.to_d, id, r.prompt, computed, tables); });
      if (st) {
        ++s_.offered;
        s_.kv_offered_tokens += computed;
        sent_.insert(id);
        if (o_.reregister_after > 0 && s_.offered == o_.reregister_after)
          if (std::string e = register_again(); !e.empty()) return e;
        // The test hook: the prefill side closes the connection; each side learns it from its transport.
        if (!o_.disconnect.decode && s_.offered == o_.disconnect.after)
          (void)link_.on_prefill([&] { return link_.prefill().disconnect(link_.to_d); });
        return "";
      }
      if (st.code() != kvpager::errc::transport_error) return std::string("kv_sender::offer: ") + st.message();
      link_gone();  // releases it with the rest
    }
    (void)P_->sched.release(id);  // held until now (not held: already released with the rest)
    ++s_.recomputed_locally;
    admit(id, 0);
    return "";
  }

  /// Registers instance I's device pools with its side's transport (`prefill`: the prefill instance's): I.mems is
  /// the region a read's runs name for each transfer layer (kv_side: one region per layer; with groups, the layers
  /// at one place of every group's block share a pool).
  std::string register_pools(instance<Cache>& I, bool prefill) {
    std::vector<kvpager::mem_handle> pm;
    for (std::int32_t l = 0; l < o_.shape.layers; ++l) {
      const std::span<std::byte> b = I.pools.device_bytes(l);
      const auto reg = [&] { return (prefill ? link_.prefill() : link_.decode()).register_memory(b.data(), b.size()); };
      const auto m = prefill ? link_.on_prefill(reg) : link_.on_decode(reg);
      if (!m) return std::string("registering a KV pool: ") + m.error().message();
      pm.push_back(*m);
    }
    I.mems.clear();
    for (const std::int32_t l : I.layer_pool) I.mems.push_back(pm[static_cast<std::size_t>(l)]);
    return "";
  }

  /// The test hook: the prefill instance's pools registered again, as after moving them (new remote keys). The old
  /// registration stays until the end of the run: reads of the offers made before may still use it.
  std::string register_again() {
    if (std::string e = register_pools(*P_, true); !e.empty()) return e;
    const kvpager::status st = link_.on_prefill([&] { return sender_->replace_regions(P_->mems); });
    return st ? "" : std::string("kv_sender::replace_regions: ") + st.message();
  }

  /// The test hook: the n-th offer's last full block below its last token gets one byte changed on the prefill
  /// side (a block the decode instance cannot have cached: it holds the request's own tokens), in transfer layer 0
  /// (table 0: an offer whose entry there a window released does not count).
  void maybe_corrupt(const sim_request& r, std::span<const block_id> table) {
    if (o_.corrupt_offer <= 0 || corrupted_) return;
    const std::int64_t full = (static_cast<std::int64_t>(r.prompt.size()) - 1) / P_->block_size();
    if (full < 1 || table[static_cast<std::size_t>(full - 1)] == instance<Cache>::null ||
        ++offers_seen_ < o_.corrupt_offer)
      return;
    corrupted_ = true;
    *P_->row(0, table[static_cast<std::size_t>(full - 1)], 1, 0, 0) ^= std::byte{1};
  }

  /// Offers that have arrived: each admitted with external tokens (a different prompt than the workload's is an
  /// error: the offer came through the transport, checked here).
  /// The offers that came before the connection went are taken first (admitted with external tokens: their reads
  /// fail, and they are computed here); link_gone then computes here the offers that did not come.
  void receive_offers() {
    std::vector<kvpager::kv_offer> offers;
    const kvpager::status st = link_.on_decode([&] { return receiver_->poll(offers); });
    if (!st && st.code() != kvpager::errc::transport_error)
      error_ = std::string("kv_receiver::poll: ") + st.message();
    for (const kvpager::kv_offer& o : offers) {
      if (sent_.erase(o.id) == 0 || o.tokens != request(o.id).prompt) {
        error_ = "the decode instance received an offer for request " + std::to_string(o.id) +
                 " that the prefill instance did not send";
        return;
      }
      admit(o.id, o.computed);
    }
    // Offers the receiver declined itself (a layout not in force): computed here; the sender was told.
    std::vector<seq_id> refused;
    receiver_->refused(refused);
    for (const seq_id id : refused) {
      if (sent_.erase(id) == 0) continue;
      ++s_.recomputed_locally;
      done_sent_.emplace_back(id, D_->clock);
      admit(id, 0);
    }
    if (!st && st.code() == kvpager::errc::transport_error) link_gone();
  }

  /// Adds request `id` to the decode instance, with `external` tokens whose KV comes from the prefill instance.
  void admit(seq_id id, std::int64_t external) {
    const sim_request& r = request(id);
    const auto a = D_->sched.add_request(
        id, r.prompt, kvpager::sequence_options{.external_tokens = static_cast<std::int32_t>(external)});
    if (!a || *a == kvpager::admission::never) {
      reject(samples(r), !a ? std::string("decode: ") + a.error().message()
                            : std::string("decode: the prompt does not fit the KV cache"));
      if (external > 0) decline(id);
      return;
    }
    live_[id] = {r.gen_seed, 0, r.max_new, r.child_ids.empty() ? nullptr : &r, index_.at(id)};
    if (external > 0) open_.insert(id);
    admitted_ = true;
  }

  /// Tells the prefill instance that request `id` will not be read. The receiver drops the offer even when the
  /// connection is gone (its done message then goes nowhere).
  void decline(seq_id id) {
    const kvpager::status st = link_.on_decode([&] { return receiver_->decline(id); });
    if (!st && st.code() == kvpager::errc::transport_error) link_gone();
    if (!st || gone_) return;
    ++s_.declined;
    done_sent_.emplace_back(id, D_->clock);
  }

  /// Starts the reads of the requests the step admitted with external KV (cache.external_blocks: which entries of
  /// its tables), all in flight together, and waits for them to end (wall clock, both transports progressing); each
  /// that arrived is checked, and reported to the cache once the decode clock reaches its start plus its time. A
  /// read that cannot start (the link is gone; with groups, a window block the prefill instance already released)
  /// is declined and reported failed: the request is computed here.
  std::string read(const kvpager::step_output& out) {
    instance<Cache>& D = *D_;
    const std::int32_t bs = D.block_size();
    std::vector<flight> flights;
    std::vector<std::span<const block_id>> tables;
    for (const seq_id id : out.external) {
      const auto x = D.cache.external_blocks(id);
      if (!x || !D.tables_of(id, tables))
        return "decode: external_blocks(" + std::to_string(id) + "): the cache lost the request";
      open_.erase(id);
      flight f{id, {}, x->first, x->count, wall_clock::now()};
      for (const std::span<const block_id> t : tables) f.tables.emplace_back(t.begin(), t.end());
      kvpager::status st{kvpager::errc::transport_error, "the connection is gone"};
      bool stale = false;
      if (!gone_) {
        ++reads_started_;
        link_.fail_reads(o_.fail_every > 0 && reads_started_ % o_.fail_every == 0);
        st = link_.on_decode([&] {
          return receiver_->start(id, tables, std::int64_t{f.first} * bs, std::int64_t{f.count} * bs);
        });
        link_.fail_reads(false);
        if (st.code() == kvpager::errc::transport_error) {
          // An offer under a layout the sender replaced (the peer still there), or the connection gone.
          stale = link_.on_decode([&] { return link_.decode().peer_alive(link_.to_p); });
          if (!stale) link_gone();
        }
      }
      if (!st) {  // not started: computed here
        if (st.code() == kvpager::errc::invalid_argument && instance<Cache>::grouped)
          ++s_.declined_released;  // the receiver keeps a window token the sender released
        else if (stale)
          ++s_.declined_stale;
        else
          ++s_.reads_failed;
        arrived_.push_back({id, false, D.clock});
        decline(id);
        continue;
      }
      ++s_.reads;
      flights.push_back(std::move(f));
      // The test hook: the decode side closes the connection with this read in flight.
      if (o_.disconnect.decode && s_.reads == o_.disconnect.after)
        (void)link_.on_decode([&] { return link_.decode().disconnect(link_.to_p); });
    }
    std::vector<kvpager::kv_received> ended;
    while (!flights.empty()) {
      ended.clear();
      (void)link_.on_decode([&] { return receiver_->progress(ended); });
      // kv_receiver::progress told the sender of each read that ended, unless the connection is gone.
      if (!link_.on_decode([&] { return link_.decode().peer_alive(link_.to_p); })) link_gone();
      const wall_clock::time_point now = wall_clock::now();
      for (const kvpager::kv_received& r : ended) {
        const auto f = std::find_if(flights.begin(), flights.end(), [&](const flight& x) { return x.id == r.id; });
        if (f == flights.end()) return "decode: a read ended that was not started: request " + std::to_string(r.id);
        const double secs = std::chrono::duration<double>(now - f->started).count();
        arrived_.push_back({r.id, r.ok, D.clock + secs});
        if (!gone_) done_sent_.emplace_back(r.id, D.clock + secs);
        if (r.ok) {
          disagg_request& q = s_.per_request[index_.at(r.id)];
          const std::int64_t tokens = std::int64_t{f->count} * bs;
          q.read_tokens += tokens;
          q.transfer_s += secs;
          s_.kv_read_tokens += tokens;
          s_.kv_transfer_bytes += r.bytes;
          s_.kv_transfer_s += secs;
          check(*f, r.bytes);
        } else {
          ++s_.reads_failed;
        }
        flights.erase(f);
      }
      if (flights.empty()) break;
      // kv_receiver fails a read past its timeout (it closes the connection); this bound only guards that promise.
      if (now - flights.front().started > 2 * o_.timeout)
        return "decode: a read did not end within twice the timeout (request " +
               std::to_string(flights.front().id) + ")";
      link_.progress();
      std::this_thread::yield();
    }
    return "";
  }

  /// Compares the blocks a read filled (the non-null entries of the receiving tables in the tokens read, every
  /// transfer layer of each table) with what computing their tokens writes, and the read's bytes with what those
  /// entries hold.
  void check(const flight& f, std::int64_t bytes) {
    instance<Cache>& D = *D_;
    const sim_request& r = request(f.id);
    const std::int32_t bs = D.block_size();
    ++s_.reads_checked;
    std::int64_t layer_blocks = 0;
    bool named = false;  // one mismatch named per read
    for (std::int32_t t = 0; t < D.tables; ++t) {
      const std::vector<block_id>& table = f.tables[static_cast<std::size_t>(t)];
      const std::vector<std::int32_t>& layers = D.table_layers[static_cast<std::size_t>(t)];
      for (std::int32_t b = f.first; b < f.first + f.count; ++b) {
        const block_id blk = table[static_cast<std::size_t>(b)];
        if (blk == instance<Cache>::null) continue;  // a window's entry: nothing received
        ++s_.blocks_checked;
        ++s_.kv_read_entries;
        layer_blocks += static_cast<std::int64_t>(layers.size());
        for (std::int32_t in = 0; in < bs && !named; ++in) {
          const std::int64_t pos = std::int64_t{b} * bs + in;
          const token_id tok = r.prompt[static_cast<std::size_t>(pos)];
          for (const std::int32_t l : layers)
            for (std::int32_t kv = 0; kv < 2 && !named; ++kv)
              for (std::int32_t h = 0; h < disagg_shape::kv_heads; ++h) {
                const kv_row want = expected_row(tok, pos, l, kv, h);
                if (std::memcmp(D.row(l, blk, kv, h, in), want.data(), sizeof want) == 0) continue;
                if (s_.mismatches++ == 0)
                  s_.first_mismatch = "request " + std::to_string(f.id) + ": the KV received for position " +
                                      std::to_string(pos) + " (layer " + std::to_string(l) +
                                      (D.tables > 1 ? " in table " + std::to_string(t) : std::string()) + ", " +
                                      (kv == 0 ? "K" : "V") + ", head " + std::to_string(h) +
                                      ") is not what computing the token writes";
                named = true;
                break;
              }
        }
      }
    }
    s_.kv_read_layer_blocks += layer_blocks;
    const std::int64_t want = layer_blocks * bs * (o_.shape.bytes_per_token() / o_.shape.layers);
    if (bytes != want && !named && s_.mismatches++ == 0)
      s_.first_mismatch = "request " + std::to_string(f.id) + ": the read moved " + std::to_string(bytes) +
                          " bytes, the receiving tables' non-null entries hold " + std::to_string(want);
  }

  /// The summary's figures once the run ended.
  void finish_figures() {
    const kvpager::scheduler_stats ds = D_->sched.stats();
    s_.external_waits = ds.external_waits;
    s_.external_failures = ds.external_failures;
    s_.prefill = P_->figures();
    s_.prefill.pools_empty = s_.prefill.pools_empty && to_offer_.empty() && done_sent_.empty();
    s_.decode = D_->figures();
    s_.decode.pools_empty = s_.decode.pools_empty && receiver_->in_flight() == 0 && receiver_->open_offers() == 0 &&
                            open_.empty() && arrived_.empty() && live_.empty();
    std::int64_t read = 0, timed = 0, shared = 0;
    double ttft = 0, share = 0;
    for (const disagg_request& q : s_.per_request) {
      if (q.ttft_s >= 0) {
        ++timed;
        ttft += q.ttft_s;
      }
      if (q.read_tokens > 0) {
        ++read;
        if (q.ttft_s > 0) {
          ++shared;
          share += q.transfer_s / q.ttft_s;
        }
      }
    }
    s_.mean_transfer_s = read > 0 ? s_.kv_transfer_s / static_cast<double>(read) : 0.0;
    s_.mean_ttft_s = timed > 0 ? ttft / static_cast<double>(timed) : 0.0;
    s_.mean_transfer_share = shared > 0 ? share / static_cast<double>(shared) : 0.0;
  }

  const workload& w_;
  const disagg_options& o_;
  disagg_summary& s_;
  std::unordered_map<seq_id, std::size_t> index_;  ///< request id -> its index in the workload
  std::unique_ptr<instance<Cache>> P_, D_;
  link<T> link_;
  std::optional<kvpager::kv_sender<T>> sender_;
  std::optional<kvpager::kv_receiver<T>> receiver_;
  std::size_t next_ = 0;                               ///< the next request to arrive
  std::deque<std::pair<seq_id, double>> to_offer_;     ///< prefill: held, offered at that (its step's end) time
  std::set<seq_id> sent_;                              ///< offered, not yet received by the decode instance
  std::set<seq_id> open_;                              ///< decode: admitted with an offer, not read or declined
  std::vector<arrived> arrived_;                       ///< decode: reads ended, not yet reported to the cache
  std::vector<std::pair<seq_id, double>> done_sent_;   ///< done messages sent at that time, not yet released
  std::set<seq_id> done_got_;                          ///< prefill: done messages received
  std::unordered_map<seq_id, live> live_;              ///< decode: samples running or queued
  std::int64_t reads_started_ = 0, offers_seen_ = 0;
  bool gone_ = false, admitted_ = false, corrupted_ = false;
  std::string error_;
};

template <class Cache>
std::string run_with(const workload& w, const disagg_options& o, disagg_summary& s) {
  if (o.transport == kv_transport_kind::inproc) return disagg_run<Cache, kvpager::inproc_transport>(w, o, s).run();
#if KVPAGER_SIM_HAS_UCX
  return disagg_run<Cache, kvpager::ucx_transport>(w, o, s).run();
#else
  return "--kv-transport ucx: this build has no UCX";
#endif
}

}  // namespace

disagg_summary run_disaggregated(const workload& w, const disagg_options& o) {
  const auto start = wall_clock::now();
  disagg_summary s;
  s.transport = o.transport == kv_transport_kind::ucx ? "ucx" : "inproc";
  for (const sim_request& r : w.requests) {
    ++s.requests;
    s.samples += 1 + static_cast<std::int64_t>(r.child_ids.size());
  }
  if (!o.groups.empty() && o.group_layers.size() != o.groups.size())
    s.error = "the KV cache groups need their layers (group_layers: one per group)";
  else if (!o.groups.empty())
    s.error = run_with<kvpager::kv_groups_swap_cache>(w, o, s);
  else if (o.composition == "vllm_v1")
    s.error = run_with<kvpager::vllm_v1_cache>(w, o, s);
  else
    s.error = run_with<kvpager::hybrid_swap_cache>(w, o, s);
  s.wall_s = std::chrono::duration<double>(wall_clock::now() - start).count();
  return s;
}

}  // namespace kvsim
