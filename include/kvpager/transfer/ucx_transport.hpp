// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// ucx_transport: the kv_transport over UCX's UCP (libucx; Debian libucx-dev). One UCP context and worker; peers
/// connect by address (a listener on one side, `connect` on the other, TCP for the connection set-up); the KV pools
/// are registered once (ucp_mem_map) and described to peers with their packed remote keys; a read posts one
/// ucp_get_nbx per run and is done when every get's completion callback has run. UCX picks the fastest path it has
/// between the two processes: shared memory (posix, cma) on one machine, TCP, or RDMA. Messages are tagged sends
/// (ucp_tag_send_nbx), received by probe, in order per connection. Errors of a peer that goes away are caught by
/// UCX's peer error handling and turn into errc::transport_error. Not included by kvpager.hpp: the one header of
/// kvpager that needs libucx (link ucp and ucs).
///
/// Every wait is bounded (ucx_options); nothing here blocks forever. One thread per transport object. Peers are
/// trusted as far as UCX's own remote keys go: a description's key is handed to ucp_ep_rkey_unpack as it came.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/transfer/transport.hpp"

KVPAGER_NAMESPACE_BEGIN

struct ucx_options {
  /// Longest wait for a connection to be set up (connect, and accept once a peer asked).
  std::chrono::milliseconds connect_timeout{5000};
  /// Longest wait for one message to leave (send) or, once it has begun to arrive, to be received whole.
  std::chrono::milliseconds message_timeout{5000};
  /// Reads and messages only over transports that detect a peer that goes away (UCX's peer error handling: TCP,
  /// RDMA), so a dead peer fails the reads in flight and the engine goes on. false: every transport UCX has,
  /// shared memory and cma included (faster on one machine), but UCX treats a peer that dies mid-transfer as fatal
  /// for this process. kvpager-generate keeps the default.
  bool detect_peer_failure = true;
};

class ucx_transport {
 public:
  /// A transport with its own UCP context and worker. errc::transport_error when UCX cannot start (its status
  /// string in the message).
  static result<ucx_transport> create(ucx_options options = {}) {
    auto d = std::make_unique<impl>();
    d->options = options;
    ucp_config_t* cfg = nullptr;
    if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK)
      return status{errc::transport_error, "ucx_transport::create: ucp_config_read failed"};
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_TAG;
    const ucs_status_t s = ucp_init(&p, cfg, &d->ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) return status{errc::transport_error, "ucx_transport::create: ucp_init failed", s};
    ucp_worker_params_t w{};
    w.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    w.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (const ucs_status_t ws = ucp_worker_create(d->ctx, &w, &d->worker); ws != UCS_OK)
      return status{errc::transport_error, "ucx_transport::create: ucp_worker_create failed", ws};
    return ucx_transport(std::move(d));
  }

  ucx_transport(ucx_transport&&) noexcept = default;
  ucx_transport& operator=(ucx_transport&&) noexcept = default;
  ~ucx_transport() = default;

  /// Listens on `host` (an IPv4 address or name; a test uses 127.0.0.1) and `port` (0: any free port). The port
  /// listened on. errc::invalid_argument for a host that does not resolve or a second listen;
  /// errc::transport_error when UCX cannot listen there (the port in use).
  result<std::uint16_t> listen(const std::string& host, std::uint16_t port) {
    if (d_->listener != nullptr) return status{errc::invalid_argument, "ucx_transport::listen: already listening"};
    sockaddr_in a{};
    if (const status st = resolve(host, port, a); !st.ok()) return st;
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&a);
    lp.sockaddr.addrlen = sizeof(a);
    lp.conn_handler.cb = &impl::on_connection;
    lp.conn_handler.arg = d_.get();
    if (const ucs_status_t s = ucp_listener_create(d_->worker, &lp, &d_->listener); s != UCS_OK) {
      d_->listener = nullptr;
      return status{errc::transport_error, "ucx_transport::listen: ucp_listener_create failed (address in use?)", s};
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(d_->listener, &attr) != UCS_OK)
      return status{errc::transport_error, "ucx_transport::listen: ucp_listener_query failed"};
    return ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  }

  /// The next peer that connected to this listener, within `timeout`: errc::timed_out when none did (nothing
  /// changed), errc::invalid_argument when not listening, errc::transport_error when the set-up failed.
  result<peer_handle> accept(std::chrono::milliseconds timeout) {
    if (d_->listener == nullptr) return status{errc::invalid_argument, "ucx_transport::accept: not listening"};
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (d_->pending.empty()) {
      if (std::chrono::steady_clock::now() >= until)
        return status{errc::timed_out, "ucx_transport::accept: no peer connected in time"};
      idle();
    }
    ucp_conn_request_h req = d_->pending.front();
    d_->pending.pop_front();
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = req;
    const peer_handle p = d_->new_peer(ep);
    if (p < 0) return status{errc::transport_error, "ucx_transport::accept: ucp_ep_create failed"};
    // Hello: this side's id for the peer goes out under the unassigned id; the peer answers under it with its own.
    if (const status st = send_tagged(p, tag(unassigned, kind_hello), as_bytes(static_cast<std::uint32_t>(p)));
        !st.ok())
      return drop(p, st);
    std::vector<std::byte> got;
    if (const status st = wait_message(p, tag(static_cast<std::uint32_t>(p), kind_hello), got, until); !st.ok())
      return drop(p, st);
    if (got.size() != 4) return drop(p, status{errc::transport_error, "ucx_transport::accept: a malformed hello"});
    d_->peers[static_cast<std::size_t>(p)]->remote_id = load_u32(got);
    if (const status st = exchange_addresses(p, until); !st.ok()) return drop(p, st);
    return p;
  }

  /// Connects to a listener at `host`:`port`. errc::invalid_argument for a host that does not resolve;
  /// errc::transport_error when nothing listens there or the set-up fails; errc::timed_out after
  /// options.connect_timeout. Nothing is left open on failure.
  result<peer_handle> connect(const std::string& host, std::uint16_t port) {
    sockaddr_in a{};
    if (const status st = resolve(host, port, a); !st.ok()) return st;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&a);
    ep.sockaddr.addrlen = sizeof(a);
    const peer_handle p = d_->new_peer(ep);
    if (p < 0) return status{errc::transport_error, "ucx_transport::connect: ucp_ep_create failed"};
    const auto until = std::chrono::steady_clock::now() + d_->options.connect_timeout;
    std::vector<std::byte> got;
    if (const status st = wait_message(p, tag(unassigned, kind_hello), got, until); !st.ok()) return drop(p, st);
    if (got.size() != 4) return drop(p, status{errc::transport_error, "ucx_transport::connect: a malformed hello"});
    peer& q = *d_->peers[static_cast<std::size_t>(p)];
    q.remote_id = load_u32(got);
    if (const status st = send_tagged(p, tag(q.remote_id, kind_hello), as_bytes(static_cast<std::uint32_t>(p)));
        !st.ok())
      return drop(p, st);
    if (const status st = exchange_addresses(p, until); !st.ok()) return drop(p, st);
    return p;
  }

  /// Closes the connection to `p` (reads in flight from it fail). errc::transport_error for an unknown peer.
  status disconnect(peer_handle p) {
    if (!known(p) || d_->peers[static_cast<std::size_t>(p)]->ep == nullptr)
      return status{errc::transport_error, "ucx_transport::disconnect: not a connected peer", p};
    d_->close(*d_->peers[static_cast<std::size_t>(p)]);
    return status{};
  }

  result<mem_handle> register_memory(void* p, std::size_t n) {
    if (p == nullptr || n == 0)
      return status{errc::invalid_argument, "ucx_transport::register_memory: a null or empty region",
                    static_cast<std::int64_t>(n)};
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = p;
    mp.length = n;
    ucp_mem_h h = nullptr;
    if (const ucs_status_t s = ucp_mem_map(d_->ctx, &mp, &h); s != UCS_OK)
      return status{errc::transport_error, "ucx_transport::register_memory: ucp_mem_map failed", s};
    d_->regions.push_back(region{detail::transfer_region{reinterpret_cast<std::uintptr_t>(p), n, true}, h});
    return static_cast<mem_handle>(d_->regions.size() - 1);
  }
  /// A region of `n` bytes allocated by UCX and registered, for a KV pool that peers on this machine read through
  /// shared memory (UCX maps it into the reader: a read is a copy, with no call into this process), as
  /// ucx_perftest's buffers are. The region's first byte (zeroed), or errc::transport_error. deregister_memory
  /// frees it.
  result<std::pair<mem_handle, void*>> allocate_memory(std::size_t n) {
    if (n == 0) return status{errc::invalid_argument, "ucx_transport::allocate_memory: an empty region"};
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = nullptr;
    mp.length = n;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h h = nullptr;
    if (const ucs_status_t s = ucp_mem_map(d_->ctx, &mp, &h); s != UCS_OK)
      return status{errc::transport_error, "ucx_transport::allocate_memory: ucp_mem_map failed", s};
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    if (ucp_mem_query(h, &attr) != UCS_OK || attr.length < n) {
      ucp_mem_unmap(d_->ctx, h);
      return status{errc::transport_error, "ucx_transport::allocate_memory: ucp_mem_query failed"};
    }
    std::memset(attr.address, 0, n);
    d_->regions.push_back(region{detail::transfer_region{reinterpret_cast<std::uintptr_t>(attr.address), n, true}, h});
    return std::pair<mem_handle, void*>{static_cast<mem_handle>(d_->regions.size() - 1), attr.address};
  }
  status deregister_memory(mem_handle m) {
    if (!local_live(m))
      return status{errc::invalid_argument, "ucx_transport::deregister_memory: not a registered region", m};
    region& r = d_->regions[static_cast<std::size_t>(m)];
    ucp_mem_unmap(d_->ctx, r.memh);
    r.memh = nullptr;
    r.span.live = false;
    return status{};
  }
  /// Region m's description: base, length, then its packed remote key (all little-endian; the key as UCX packs it).
  status describe(mem_handle m, std::vector<std::byte>& out) const {
    if (!local_live(m)) return status{errc::invalid_argument, "ucx_transport::describe: not a registered region", m};
    const region& r = d_->regions[static_cast<std::size_t>(m)];
    void* key = nullptr;
    std::size_t key_len = 0;
    if (const ucs_status_t s = ucp_rkey_pack(d_->ctx, r.memh, &key, &key_len); s != UCS_OK)
      return status{errc::transport_error, "ucx_transport::describe: ucp_rkey_pack failed", s};
    out.clear();
    detail::put_u64(out, r.span.base);
    detail::put_u64(out, r.span.bytes);
    const auto* k = static_cast<const std::byte*>(key);
    out.insert(out.end(), k, k + key_len);
    ucp_rkey_buffer_release(key);
    return status{};
  }
  /// A peer's region from its description: errc::transport_error for a peer that is not connected, a description
  /// too short, or a key UCX does not accept on this connection.
  result<remote_handle> import_remote(peer_handle p, std::span<const std::byte> bytes) {
    if (!alive(p)) return no_peer(p);
    if (bytes.size() <= 16)
      return status{errc::transport_error, "ucx_transport::import_remote: not a region description",
                    static_cast<std::int64_t>(bytes.size())};
    ucp_rkey_h rkey = nullptr;
    if (const ucs_status_t s = ucp_ep_rkey_unpack(d_->peers[static_cast<std::size_t>(p)]->data, bytes.data() + 16, &rkey);
        s != UCS_OK)
      return status{errc::transport_error, "ucx_transport::import_remote: the remote key is not valid here", s};
    d_->remotes.push_back(remote{p, detail::get_u64(bytes, 0), detail::get_u64(bytes, 8), rkey});
    return static_cast<remote_handle>(d_->remotes.size() - 1);
  }
  status release_remote(remote_handle r) {
    if (!remote_live(r)) return status{errc::invalid_argument, "ucx_transport::release_remote: not an imported region", r};
    remote& x = d_->remotes[static_cast<std::size_t>(r)];
    ucp_rkey_destroy(x.rkey);
    x.rkey = nullptr;
    return status{};
  }

  /// Posts one get per run from the peer's regions; the read is done when every get has completed (each counted
  /// by its completion callback). Errors, nothing posted: errc::transport_error for a peer that is gone;
  /// errc::invalid_argument for a run outside its regions or a region not imported from this peer.
  result<transfer_handle> read(peer_handle p, std::span<const kv_run> runs, std::span<const remote_handle> src,
                               std::span<const mem_handle> dst) {
    if (!alive(p)) return no_peer(p);
    for (const remote_handle r : src)
      if (!remote_live(r) || d_->remotes[static_cast<std::size_t>(r)].from != p)
        return status{errc::invalid_argument, "ucx_transport::read: a source region not imported from this peer", r};
    d_->scratch.clear();
    for (const region& r : d_->regions) d_->scratch.push_back(r.span);
    const auto remote_len = [this](remote_handle r) {
      return static_cast<std::int64_t>(d_->remotes[static_cast<std::size_t>(r)].bytes);
    };
    if (const status st = detail::check_runs(runs, src, dst, d_->scratch, remote_len); !st.ok()) return st;
    ucp_ep_h ep = d_->peers[static_cast<std::size_t>(p)]->data;
    auto f = std::make_unique<flight>();
    f->id = d_->next++;
    f->from = p;
    ucp_request_param_t cb{};
    cb.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    cb.cb.send = &impl::on_get;
    cb.user_data = f.get();
    for (const kv_run& run : runs) {
      if (run.bytes == 0) continue;
      const remote& from = d_->remotes[static_cast<std::size_t>(src[static_cast<std::size_t>(run.src_region)])];
      const region& to = d_->regions[static_cast<std::size_t>(dst[static_cast<std::size_t>(run.dst_region)])];
      ucs_status_ptr_t q = ucp_get_nbx(ep, reinterpret_cast<void*>(to.span.base + static_cast<std::uintptr_t>(run.dst_offset)),
                                       static_cast<std::size_t>(run.bytes), from.base + static_cast<std::uint64_t>(run.src_offset),
                                       from.rkey, &cb);
      if (UCS_PTR_IS_ERR(q)) {
        f->failed = true;  // the gets posted before still complete (or fail) and are counted
        break;
      }
      if (q != nullptr) ++f->pending;
    }
    d_->flights.push_back(std::move(f));
    return d_->flights.back()->id;
  }
  /// The read's state: in_flight while any of its gets has not completed; then done, or failed when one failed.
  result<transfer_state> poll(transfer_handle x) {
    progress();
    for (std::size_t i = 0; i < d_->flights.size(); ++i) {
      const flight& f = *d_->flights[i];
      if (f.id != x) continue;
      if (f.pending > 0) return transfer_state::in_flight;
      const transfer_state s = f.failed ? transfer_state::failed : transfer_state::done;
      d_->flights.erase(d_->flights.begin() + static_cast<std::ptrdiff_t>(i));
      return s;
    }
    return status{errc::invalid_argument, "ucx_transport::poll: not a transfer in flight", x};
  }

  /// Sends one message; waits (at most options.message_timeout) until UCX has taken it.
  status send(peer_handle p, std::span<const std::byte> bytes) {
    if (!alive(p) || !d_->peers[static_cast<std::size_t>(p)]->ready) return no_peer(p);
    return send_tagged(p, tag(d_->peers[static_cast<std::size_t>(p)]->remote_id, kind_message), bytes);
  }
  /// The next message from `p` if one has arrived (false: none yet). errc::transport_error once the peer is gone
  /// and nothing it sent is left.
  result<bool> receive(peer_handle p, std::vector<std::byte>& out) {
    if (!known(p) || !d_->peers[static_cast<std::size_t>(p)]->ready) return no_peer(p);
    progress();
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(d_->worker, tag(static_cast<std::uint32_t>(p), kind_message), full_mask, 1, &info);
    if (msg == nullptr) {
      if (!alive(p)) return no_peer(p);
      return false;
    }
    if (const status st = receive_probed(msg, info, out, std::chrono::steady_clock::now() + d_->options.message_timeout);
        !st.ok())
      return st;
    return true;
  }
  [[nodiscard]] bool peer_alive(peer_handle p) const noexcept { return alive(p); }

  /// Runs UCX's progress engine until it has nothing more to do now.
  void progress() {
    for (int i = 0; i < 1024 && ucp_worker_progress(d_->worker) != 0; ++i) {
    }
  }
  /// Reads started and not yet ended by a poll.
  [[nodiscard]] std::size_t reads_in_flight() const noexcept { return d_->flights.size(); }

 private:
  static constexpr std::uint32_t unassigned = 0xFFFFFFFFU;
  static constexpr std::uint32_t kind_hello = 1;
  static constexpr std::uint32_t kind_message = 2;
  static constexpr std::uint32_t kind_address = 3;
  static constexpr ucp_tag_t full_mask = ~ucp_tag_t{0};

  struct peer {
    ucp_ep_h ep = nullptr;       ///< the connection's endpoint (set-up messages)
    ucp_ep_h data = nullptr;     ///< to the peer's worker address: every transport UCX has to it (shared memory too)
    bool alive = false;
    bool ready = false;             ///< the hello exchange is done
    std::uint32_t remote_id = 0;    ///< the peer's id for this side (the tag of what goes to it)
  };
  struct region {
    detail::transfer_region span;
    ucp_mem_h memh = nullptr;
  };
  struct remote {
    peer_handle from = -1;
    std::uint64_t base = 0;
    std::uint64_t bytes = 0;
    ucp_rkey_h rkey = nullptr;
  };
  struct flight {
    transfer_handle id = 0;
    peer_handle from = -1;
    std::int64_t pending = 0;  ///< gets posted and not completed
    bool failed = false;
  };
  struct impl {
    ucx_options options;
    ucp_context_h ctx = nullptr;
    ucp_worker_h worker = nullptr;
    ucp_listener_h listener = nullptr;
    std::deque<ucp_conn_request_h> pending;
    std::vector<std::unique_ptr<peer>> peers;  // stable addresses: the error handler's argument
    std::vector<region> regions;
    std::vector<remote> remotes;
    std::vector<std::unique_ptr<flight>> flights;  // stable addresses: the gets' callbacks count on them
    std::vector<detail::transfer_region> scratch;
    std::vector<std::vector<std::byte>> graveyard;  // buffers of receives that timed out (UCX may still write them)
    transfer_handle next = 1;

    static void on_connection(ucp_conn_request_h req, void* arg) { static_cast<impl*>(arg)->pending.push_back(req); }
    static void on_error(void* arg, ucp_ep_h, ucs_status_t) { static_cast<peer*>(arg)->alive = false; }
    static void on_get(void* request, ucs_status_t s, void* arg) {
      auto* f = static_cast<flight*>(arg);
      --f->pending;
      if (s != UCS_OK) f->failed = true;
      ucp_request_free(request);
    }

    /// A new peer over endpoint parameters `ep` (error handling added): its handle, or -1.
    peer_handle new_peer(ucp_ep_params_t& ep) {
      auto q = std::make_unique<peer>();
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &impl::on_error;
      ep.err_handler.arg = q.get();
      if (ucp_ep_create(worker, &ep, &q->ep) != UCS_OK) return -1;
      q->alive = true;
      peers.push_back(std::move(q));
      return static_cast<peer_handle>(peers.size() - 1);
    }
    /// Closes a peer's endpoint (forcibly: the peer may be gone), waiting at most the connect timeout.
    void close(peer& q) {
      for (ucp_ep_h* e : {&q.data, &q.ep}) {
        if (*e == nullptr) continue;
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t r = ucp_ep_close_nbx(*e, &p);
        if (UCS_PTR_IS_PTR(r)) {
          const auto until = std::chrono::steady_clock::now() + options.connect_timeout;
          while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < until)
            ucp_worker_progress(worker);
          ucp_request_free(r);
        }
        *e = nullptr;
      }
      q.alive = false;
      q.ready = false;
    }
    /// Receives and drops every message that arrived and was never received (a peer's after its connection was
    /// closed or given up on): UCX warns about each one still queued when the worker goes. A receive that does not
    /// end within the message timeout is cancelled; its buffer is kept (UCX may still write it).
    void drop_unreceived() {
      std::vector<std::byte> sink;
      for (;;) {
        ucp_tag_recv_info_t info{};
        ucp_tag_message_h msg = ucp_tag_probe_nb(worker, 0, 0, 1, &info);
        if (msg == nullptr) return;
        sink.resize(info.length);
        ucp_request_param_t none{};
        ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker, sink.data(), sink.size(), msg, &none);
        if (!UCS_PTR_IS_PTR(r)) continue;
        const auto until = std::chrono::steady_clock::now() + options.message_timeout;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < until)
          ucp_worker_progress(worker);
        if (ucp_request_check_status(r) == UCS_INPROGRESS) {
          ucp_request_cancel(worker, r);
          graveyard.push_back(std::move(sink));
          sink = {};
        }
        ucp_request_free(r);
      }
    }
    ~impl() {
      for (auto& q : peers) close(*q);  // gets in flight end here (their callbacks still find their flights)
      if (worker != nullptr) drop_unreceived();
      for (remote& r : remotes)
        if (r.rkey != nullptr) ucp_rkey_destroy(r.rkey);
      for (ucp_conn_request_h r : pending) ucp_listener_reject(listener, r);
      if (listener != nullptr) ucp_listener_destroy(listener);
      for (region& r : regions)
        if (r.memh != nullptr) ucp_mem_unmap(ctx, r.memh);
      if (worker != nullptr) ucp_worker_destroy(worker);
      if (ctx != nullptr) ucp_cleanup(ctx);
    }
  };

  explicit ucx_transport(std::unique_ptr<impl> d) noexcept : d_(std::move(d)) {}

  static constexpr ucp_tag_t tag(std::uint32_t id, std::uint32_t kind) noexcept {
    return (static_cast<ucp_tag_t>(id) << 32) | kind;
  }
  static std::vector<std::byte> as_bytes(std::uint32_t v) {
    std::vector<std::byte> b(4);
    for (int i = 0; i < 4; ++i) b[static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xFFU);
    return b;
  }
  static std::uint32_t load_u32(const std::vector<std::byte>& b) noexcept {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(b[static_cast<std::size_t>(i)]) << (8 * i);
    return v;
  }
  static status resolve(const std::string& host, std::uint16_t port, sockaddr_in& out) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr)
      return status{errc::invalid_argument, "ucx_transport: the host does not resolve to an IPv4 address"};
    std::memcpy(&out, res->ai_addr, sizeof(out));
    freeaddrinfo(res);
    out.sin_port = htons(port);
    return status{};
  }

  void idle() {
    progress();
    std::this_thread::yield();
  }
  [[nodiscard]] bool known(peer_handle p) const noexcept {
    return p >= 0 && static_cast<std::size_t>(p) < d_->peers.size();
  }
  [[nodiscard]] bool alive(peer_handle p) const noexcept {
    return known(p) && d_->peers[static_cast<std::size_t>(p)]->alive;
  }
  [[nodiscard]] bool local_live(mem_handle m) const noexcept {
    return m >= 0 && static_cast<std::size_t>(m) < d_->regions.size() && d_->regions[static_cast<std::size_t>(m)].span.live;
  }
  [[nodiscard]] bool remote_live(remote_handle r) const noexcept {
    return r >= 0 && static_cast<std::size_t>(r) < d_->remotes.size() && d_->remotes[static_cast<std::size_t>(r)].rkey != nullptr;
  }
  static status no_peer(peer_handle p) noexcept {
    return status{errc::transport_error, "ucx_transport: the peer is not connected (gone, or never was)", p};
  }
  /// Closes a peer whose set-up failed; the set-up's error.
  status drop(peer_handle p, status st) {
    d_->close(*d_->peers[static_cast<std::size_t>(p)]);
    return st;
  }

  /// The second half of a set-up: each side sends its worker address over the connection and opens an endpoint to
  /// the other's (`data`), over which UCX may use every transport it has to that process (shared memory and cma on
  /// one machine; the connection's own endpoint has only what the connection manager wires: TCP here). Reads,
  /// remote keys and messages then go over it.
  status exchange_addresses(peer_handle p, std::chrono::steady_clock::time_point until) {
    peer& q = *d_->peers[static_cast<std::size_t>(p)];
    ucp_address_t* addr = nullptr;
    std::size_t len = 0;
    if (const ucs_status_t s = ucp_worker_get_address(d_->worker, &addr, &len); s != UCS_OK)
      return status{errc::transport_error, "ucx_transport: ucp_worker_get_address failed", s};
    const auto* a = reinterpret_cast<const std::byte*>(addr);
    const std::vector<std::byte> mine(a, a + len);
    ucp_worker_release_address(d_->worker, addr);
    if (const status st = send_tagged(p, tag(q.remote_id, kind_address), mine); !st.ok()) return st;
    std::vector<std::byte> theirs;
    if (const status st = wait_message(p, tag(static_cast<std::uint32_t>(p), kind_address), theirs, until); !st.ok())
      return st;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(theirs.data());
    ep.err_mode = d_->options.detect_peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &impl::on_error;
    ep.err_handler.arg = &q;
    if (const ucs_status_t s = ucp_ep_create(d_->worker, &ep, &q.data); s != UCS_OK) {
      q.data = nullptr;
      return status{errc::transport_error, "ucx_transport: ucp_ep_create to the peer's worker address failed", s};
    }
    q.ready = true;
    return status{};
  }

  /// Waits for `r` (a UCX request or an immediate status) until `until`; cancels it on the deadline.
  status wait(ucs_status_ptr_t r, std::chrono::steady_clock::time_point until, const char* what) {
    if (r == nullptr) return status{};
    if (UCS_PTR_IS_ERR(r)) return status{errc::transport_error, what, UCS_PTR_STATUS(r)};
    while (ucp_request_check_status(r) == UCS_INPROGRESS) {
      if (std::chrono::steady_clock::now() >= until) {
        ucp_request_cancel(d_->worker, r);
        ucp_request_free(r);
        return status{errc::timed_out, what};
      }
      idle();
    }
    const ucs_status_t s = ucp_request_check_status(r);
    ucp_request_free(r);
    if (s != UCS_OK) return status{errc::transport_error, what, s};
    return status{};
  }
  /// A send UCX has not finished within the timeout cannot be taken back (UCX may still read its buffer): the
  /// connection is closed, which ends it, before the caller's buffer can change.
  status send_tagged(peer_handle p, ucp_tag_t t, std::span<const std::byte> bytes) {
    ucp_request_param_t none{};
    peer& q = *d_->peers[static_cast<std::size_t>(p)];
    ucs_status_ptr_t r = ucp_tag_send_nbx(q.data != nullptr ? q.data : q.ep, bytes.data(), bytes.size(), t, &none);
    const status st = wait(r, std::chrono::steady_clock::now() + d_->options.message_timeout, "ucx_transport: a send failed");
    if (st.code() == errc::timed_out) d_->close(q);
    return st;
  }
  status receive_probed(ucp_tag_message_h msg, const ucp_tag_recv_info_t& info, std::vector<std::byte>& out,
                        std::chrono::steady_clock::time_point until) {
    out.resize(info.length);
    ucp_request_param_t none{};
    ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(d_->worker, out.data(), out.size(), msg, &none);
    const status st = wait(r, until, "ucx_transport: a receive failed");
    if (st.code() == errc::timed_out) {  // UCX may still write into `out`'s buffer: it is kept until the end
      d_->graveyard.push_back(std::move(out));
      out = {};
    }
    return st;
  }
  /// Waits until a message tagged `t` arrives, while peer `p` (being set up) is alive.
  status wait_message(peer_handle p, ucp_tag_t t, std::vector<std::byte>& out, std::chrono::steady_clock::time_point until) {
    for (;;) {
      progress();
      ucp_tag_recv_info_t info{};
      if (ucp_tag_message_h msg = ucp_tag_probe_nb(d_->worker, t, full_mask, 1, &info); msg != nullptr)
        return receive_probed(msg, info, out, until);
      if (!alive(p))
        return status{errc::transport_error, "ucx_transport: the connection failed (nothing listening there?)"};
      if (std::chrono::steady_clock::now() >= until)
        return status{errc::timed_out, "ucx_transport: the peer did not answer in time"};
      std::this_thread::yield();
    }
  }

  std::unique_ptr<impl> d_;
};
static_assert(kv_transport<ucx_transport>);

KVPAGER_NAMESPACE_END
