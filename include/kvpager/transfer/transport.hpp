// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The KV transport concept: what moves a request's KV bytes between two caches (kv_runs.hpp plans them), and the
/// small messages that go with them, over a connection to a peer. A table with an archetype, like the policies.
/// The shipped models: inproc_transport (a copy inside one process: tests, one-process engines) and ucx_transport
/// (UCX's UCP: one-sided reads of registered pools over shared memory, TCP or RDMA; ucx_transport.hpp, which needs
/// libucx).
///
/// | operation | meaning |
/// |---|---|
/// | `register_memory(p, n)` -> `result<mem_handle>` | makes [p, p + n) readable and writable by transfers (a KV pool: once, at start) |
/// | `deregister_memory(m)` -> `status` | the region is no longer used by any transfer |
/// | `describe(m, out)` -> `status` | what a peer needs to read region m (address, size, remote key), as bytes |
/// | `import_remote(peer, bytes)` -> `result<remote_handle>` | a peer's description, made a region this side can read |
/// | `release_remote(r)` -> `status` | forgets an imported region |
/// | `read(peer, runs, src, dst)` -> `result<transfer_handle>` | starts reading each run from the peer's region `src[run.src_region]` into the local `dst[run.dst_region]`; every run is checked against both regions' sizes first (errc::invalid_argument, nothing started) |
/// | `poll(x)` -> `result<transfer_state>` | progress; `done` or `failed` ends the handle (a later poll of it: errc::invalid_argument) |
/// | `send(peer, bytes)` -> `status` | one message to the peer, in order with the others on that connection |
/// | `receive(peer, out)` -> `result<bool>` | the next whole message from the peer into `out`, if one has arrived |
/// | `peer_alive(peer)` -> `bool` | false once the connection failed or the peer went away |
/// | `disconnect(peer)` -> `status` | closes the connection: reads in flight from the peer end (failed), so their destination blocks may be reused once poll says so |
///
/// Errors: errc::transport_error (no such peer, a peer that is gone, a description that does not match a region
/// of that peer), errc::invalid_argument (a handle that is not live, a run outside its region), errc::timed_out.
/// Connecting is each model's own (an address for UCX, two objects for inproc): a peer_handle comes from there.
/// Calls on one transport object come from one thread.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/transfer/kv_runs.hpp"

KVPAGER_NAMESPACE_BEGIN

using mem_handle = std::int32_t;
using remote_handle = std::int32_t;
using peer_handle = std::int32_t;
using transfer_handle = std::int64_t;

/// Where a started read stands.
enum class transfer_state : std::uint8_t {
  in_flight,  ///< still moving
  done,       ///< every run arrived
  failed,     ///< the transport failed (the peer went away, the link broke): which runs arrived is unknown
};

template <class T>
concept kv_transport = requires(T& t, const T& ct, void* p, std::size_t n, mem_handle m, remote_handle r,
                                peer_handle peer, std::span<const std::byte> bytes, std::vector<std::byte>& buf,
                                std::span<const kv_run> runs, std::span<const remote_handle> src,
                                std::span<const mem_handle> dst, transfer_handle x) {
  { t.register_memory(p, n) } -> std::same_as<result<mem_handle>>;
  { t.deregister_memory(m) } -> std::same_as<status>;
  { ct.describe(m, buf) } -> std::same_as<status>;
  { t.import_remote(peer, bytes) } -> std::same_as<result<remote_handle>>;
  { t.release_remote(r) } -> std::same_as<status>;
  { t.read(peer, runs, src, dst) } -> std::same_as<result<transfer_handle>>;
  { t.poll(x) } -> std::same_as<result<transfer_state>>;
  { t.send(peer, bytes) } -> std::same_as<status>;
  { t.receive(peer, buf) } -> std::same_as<result<bool>>;
  { ct.peer_alive(peer) } -> std::same_as<bool>;
  { t.disconnect(peer) } -> std::same_as<status>;
};

/// The least a transport provides: every operation, each failing. A check that kv_transport asks for no more than
/// this table says, and a start for a new model.
struct transport_archetype {
  result<mem_handle> register_memory(void*, std::size_t) { return unsupported(); }
  status deregister_memory(mem_handle) { return unsupported(); }
  status describe(mem_handle, std::vector<std::byte>&) const { return unsupported(); }
  result<remote_handle> import_remote(peer_handle, std::span<const std::byte>) { return unsupported(); }
  status release_remote(remote_handle) { return unsupported(); }
  result<transfer_handle> read(peer_handle, std::span<const kv_run>, std::span<const remote_handle>,
                               std::span<const mem_handle>) {
    return unsupported();
  }
  result<transfer_state> poll(transfer_handle) { return unsupported(); }
  status send(peer_handle, std::span<const std::byte>) { return unsupported(); }
  result<bool> receive(peer_handle, std::vector<std::byte>&) { return unsupported(); }
  bool peer_alive(peer_handle) const { return false; }
  status disconnect(peer_handle) { return unsupported(); }

 private:
  static status unsupported() noexcept { return status{errc::unsupported, "transport_archetype: no transport"}; }
};
static_assert(kv_transport<transport_archetype>);

namespace detail {

/// A registered or imported region: its base and length.
struct transfer_region {
  std::uintptr_t base = 0;
  std::uint64_t bytes = 0;
  bool live = false;
};

/// Checks every run of a read against the local regions `dst` and remote regions `src` (by index into the region
/// lists `local` and `remote`): errc::invalid_argument naming the first run outside its region.
template <class RemoteLen>
[[nodiscard]] status check_runs(std::span<const kv_run> runs, std::span<const remote_handle> src,
                                std::span<const mem_handle> dst, std::span<const transfer_region> local,
                                RemoteLen remote_len) {
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const kv_run& r = runs[i];
    const auto n = static_cast<std::int64_t>(i);
    if (r.bytes < 0 || r.src_offset < 0 || r.dst_offset < 0)
      return status{errc::invalid_argument, "transport read: a run with a negative offset or size", n};
    if (r.src_region < 0 || static_cast<std::size_t>(r.src_region) >= src.size() || r.dst_region < 0 ||
        static_cast<std::size_t>(r.dst_region) >= dst.size())
      return status{errc::invalid_argument, "transport read: a run names a region the read was not given", n};
    const mem_handle m = dst[static_cast<std::size_t>(r.dst_region)];
    if (m < 0 || static_cast<std::size_t>(m) >= local.size() || !local[static_cast<std::size_t>(m)].live)
      return status{errc::invalid_argument, "transport read: a local region that is not registered", m};
    const std::uint64_t dlen = local[static_cast<std::size_t>(m)].bytes;
    if (static_cast<std::uint64_t>(r.dst_offset) > dlen || static_cast<std::uint64_t>(r.bytes) > dlen - static_cast<std::uint64_t>(r.dst_offset))
      return status{errc::invalid_argument, "transport read: a run outside its local region", n};
    const std::int64_t slen = remote_len(src[static_cast<std::size_t>(r.src_region)]);
    if (slen < 0) return status{errc::invalid_argument, "transport read: a remote region that is not imported", n};
    if (r.src_offset > slen || r.bytes > slen - r.src_offset)
      return status{errc::invalid_argument, "transport read: a run outside its remote region", n};
  }
  return status{};
}

/// Little-endian fixed-width fields of a region description.
inline void put_u64(std::vector<std::byte>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFFU));
}
[[nodiscard]] inline std::uint64_t get_u64(std::span<const std::byte> in, std::size_t at) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(in[at + static_cast<std::size_t>(i)]) << (8 * i);
  return v;
}

}  // namespace detail

KVPAGER_NAMESPACE_END
