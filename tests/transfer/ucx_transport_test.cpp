// SPDX-License-Identifier: Apache-2.0
// ucx_transport over the loopback: a request's KV reshaped (block size and tensor-parallel degree) between two
// transports in one process (two threads), and between two processes (this test binary started again as the
// sender), content checked byte for byte; a sender that dies mid-transfer; an address nobody listens on; a
// description UCX does not accept. Every process started is reaped; every wait is bounded.
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvpager/transfer/kv_runs.hpp"
#include "kvpager/transfer/ucx_transport.hpp"
#include "kvpager_testing/ucx_peer_process.hpp"
#include "transfer_support.hpp"

namespace kvpager {
namespace {

using namespace std::chrono_literals;

constexpr std::uint8_t pattern(std::size_t i) { return static_cast<std::uint8_t>((i * 131U + (i >> 11)) & 0xFFU); }

/// Receives one message from `p` within `timeout` (false: none came, or the peer went away).
bool receive_within(ucx_transport& t, peer_handle p, std::vector<std::byte>& out, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    const result<bool> r = t.receive(p, out);
    if (!r.ok()) return false;
    if (*r) return true;
    std::this_thread::yield();
  }
  return false;
}

/// Polls a read until it ends or `timeout` passes (then in_flight).
transfer_state finish(ucx_transport& t, transfer_handle x, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const result<transfer_state> s = t.poll(x);
    if (!s.ok()) return transfer_state::failed;
    if (*s != transfer_state::in_flight || std::chrono::steady_clock::now() >= until) return *s;
    std::this_thread::yield();
  }
}

// The child process's role, run before main when this binary is started with KVPAGER_UCX_TEST_SENDER=<fd>:<MiB>:
// listen on the loopback, report the port, accept one peer, register a region of MiB mebibytes filled with
// pattern(), send its description, then wait (at most 30 s) for a message or the peer's end, and exit.
struct sender_role {
  sender_role() {
    const char* env = std::getenv("KVPAGER_UCX_TEST_SENDER");
    if (env == nullptr) return;
    int fd = -1;
    long mib = 0;
    if (std::sscanf(env, "%d:%ld", &fd, &mib) != 2) _exit(3);
    _exit(run(fd, static_cast<std::size_t>(mib) << 20));
  }
  static int run(int fd, std::size_t bytes) {
    result<ucx_transport> t = ucx_transport::create();
    if (!t.ok()) return 4;
    const result<peer_handle> p = testing::listen_report_accept(*t, fd, 10000ms);
    if (!p.ok()) return 7;
    std::vector<std::uint8_t> pool(bytes);
    for (std::size_t i = 0; i < bytes; ++i) pool[i] = pattern(i);
    const result<mem_handle> m = t->register_memory(pool.data(), pool.size());
    std::vector<std::byte> desc;
    if (!m.ok() || !t->describe(*m, desc).ok() || !t->send(*p, desc).ok()) return 8;
    std::vector<std::byte> got;
    receive_within(*t, *p, got, 30000ms);
    return 0;
  }
};
const sender_role the_sender_role;

/// A sender process of `mib` MiB: this binary started again in the sender role.
std::string mib_suffix(long mib) {  // ":<mib>" (snprintf: GCC 12's -Wrestrict misfires on ":" + std::to_string)
  char b[32];
  std::snprintf(b, sizeof b, ":%ld", mib);
  return b;
}
struct sender_process : testing::peer_process {
  explicit sender_process(long mib) : peer_process("KVPAGER_UCX_TEST_SENDER", mib_suffix(mib)) {}
};

/// Connects to the sender process and imports the region it describes.
struct connected {
  peer_handle peer = -1;
  remote_handle remote = -1;
};
connected connect_and_import(ucx_transport& t, std::uint16_t port) {
  connected c;
  const result<peer_handle> p = t.connect("127.0.0.1", port);
  EXPECT_TRUE(p.ok()) << p.error().message();
  if (!p.ok()) return c;
  c.peer = *p;
  std::vector<std::byte> desc;
  EXPECT_TRUE(receive_within(t, c.peer, desc, 20000ms));
  const result<remote_handle> r = t.import_remote(c.peer, desc);
  EXPECT_TRUE(r.ok()) << r.error().message();
  if (r.ok()) c.remote = *r;
  return c;
}

TEST(UcxTransport, ReshapesARequestBetweenTwoTransportsInOneProcess) {
  const test::model m{4, 3, 8, 32, kv_dtype::bf16};
  std::mt19937_64 rng(11);
  const std::int64_t tokens = 97;
  // Sender: TP 1, 16-token blocks, per-layer pools. Receivers: TP 2, 64-token blocks, block-major pools.
  test::kv_rank s = test::kv_rank::make(m, 16, 1, 0, kv_pool_layout::per_layer, tokens, rng);
  std::vector<test::kv_rank> recv;
  for (std::int32_t r = 0; r < 2; ++r) recv.push_back(test::kv_rank::make(m, 64, 2, r, kv_pool_layout::block_major, tokens, rng));
  s.fill_request(m, tokens);

  result<ucx_transport> st = ucx_transport::create();
  ASSERT_TRUE(st.ok()) << st.error().message();
  const result<std::uint16_t> port = st->listen("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.error().message();
  std::thread sender([&] {
    std::vector<mem_handle> mems;
    for (auto& reg : s.regions) mems.push_back(*st->register_memory(reg.data(), reg.size()));
    for (int k = 0; k < 2; ++k) {
      const result<peer_handle> p = st->accept(10000ms);
      ASSERT_TRUE(p.ok()) << p.error().message();
      std::vector<std::byte> desc;
      for (const mem_handle h : mems) {
        ASSERT_TRUE(st->describe(h, desc).ok());
        ASSERT_TRUE(st->send(*p, desc).ok());
      }
      std::vector<std::byte> done;
      EXPECT_TRUE(receive_within(*st, *p, done, 20000ms)) << "the receiver says when it has read";
    }
  });
  for (test::kv_rank& d : recv) {
    result<ucx_transport> rt = ucx_transport::create();
    ASSERT_TRUE(rt.ok());
    const result<peer_handle> p = rt->connect("127.0.0.1", *port);
    ASSERT_TRUE(p.ok()) << p.error().message();
    std::vector<remote_handle> remotes;
    for (std::size_t i = 0; i < s.regions.size(); ++i) {
      std::vector<std::byte> desc;
      ASSERT_TRUE(receive_within(*rt, *p, desc, 20000ms));
      const result<remote_handle> r = rt->import_remote(*p, desc);
      ASSERT_TRUE(r.ok()) << r.error().message();
      remotes.push_back(*r);
    }
    std::vector<mem_handle> mine;
    for (auto& reg : d.regions) mine.push_back(*rt->register_memory(reg.data(), reg.size()));
    std::vector<kv_run> runs;
    ASSERT_TRUE(plan_kv_runs(s.side, s.tables_view(), d.side, d.tables_view(), tokens, runs).ok());
    const result<transfer_handle> x = rt->read(*p, runs, remotes, mine);
    ASSERT_TRUE(x.ok()) << x.error().message();
    EXPECT_EQ(finish(*rt, *x, 20000ms), transfer_state::done);
    EXPECT_TRUE(d.request_matches(m, tokens)) << "receiver rank " << d.side.rank.rank;
    EXPECT_EQ(rt->reads_in_flight(), 0U);
    const std::byte bye[1] = {std::byte{1}};
    EXPECT_TRUE(rt->send(*p, bye).ok());
  }
  sender.join();
}

TEST(UcxTransport, ReadsFromAnotherProcess) {
  sender_process child(8);
  ASSERT_NE(child.port, 0) << "the sender process did not start listening";
  result<ucx_transport> t = ucx_transport::create();
  ASSERT_TRUE(t.ok());
  const connected c = connect_and_import(*t, child.port);
  ASSERT_GE(c.remote, 0);
  const peer_handle* p = &c.peer;
  std::vector<std::uint8_t> mine(8U << 20, 0);
  const result<mem_handle> mh = t->register_memory(mine.data(), mine.size());
  ASSERT_TRUE(mh.ok());
  // Blocks of 4 KiB read in a shuffled order into shuffled places, plus a run outside the peer's region (refused).
  std::vector<kv_run> runs;
  std::vector<std::int64_t> to(2048);
  for (std::size_t i = 0; i < to.size(); ++i) to[i] = static_cast<std::int64_t>(i);
  std::shuffle(to.begin(), to.end(), std::mt19937_64(5));
  for (std::size_t i = 0; i < 1024; ++i) runs.push_back(kv_run{0, 0, static_cast<std::int64_t>(i) * 4096, to[i] * 4096, 4096});
  const remote_handle rs[1] = {c.remote};
  const mem_handle ds[1] = {*mh};
  const kv_run outside[1] = {kv_run{0, 0, (8 << 20) - 100, 0, 200}};
  EXPECT_EQ(t->read(*p, outside, rs, ds).code(), errc::invalid_argument);
  const result<transfer_handle> x = t->read(*p, runs, rs, ds);
  ASSERT_TRUE(x.ok()) << x.error().message();
  ASSERT_EQ(finish(*t, *x, 20000ms), transfer_state::done);
  bool same = true;
  for (std::size_t i = 0; i < 1024 && same; ++i)
    for (std::size_t b = 0; b < 4096; ++b)
      if (mine[static_cast<std::size_t>(to[i]) * 4096 + b] != pattern(i * 4096 + b)) same = false;
  EXPECT_TRUE(same);
  const std::byte bye[1] = {std::byte{1}};
  EXPECT_TRUE(t->send(*p, bye).ok());
  EXPECT_EQ(child.reap(), 0);
}

TEST(UcxTransport, ASenderThatDiesMidTransferEndsTheReadAndThePeer) {
  sender_process child(256);
  ASSERT_NE(child.port, 0);
  ucx_options o;
  o.message_timeout = 2000ms;
  result<ucx_transport> t = ucx_transport::create(o);
  ASSERT_TRUE(t.ok());
  const connected c = connect_and_import(*t, child.port);
  ASSERT_GE(c.remote, 0);
  const peer_handle* p = &c.peer;
  std::vector<std::uint8_t> mine(256U << 20, 0);
  const result<mem_handle> mh = t->register_memory(mine.data(), mine.size());
  std::vector<kv_run> runs;
  for (std::int64_t i = 0; i < 4096; ++i) runs.push_back(kv_run{0, 0, i * 65536, i * 65536, 65536});
  const remote_handle rs[1] = {c.remote};
  const mem_handle ds[1] = {*mh};
  const result<transfer_handle> x = t->read(*p, runs, rs, ds);
  ASSERT_TRUE(x.ok());
  child.kill_now();
  EXPECT_EQ(child.reap(), -1);
  // The read ends (done if it beat the kill, else failed), and then the peer is known to be gone: a new read and a
  // send fail, nothing hangs.
  const transfer_state s = finish(*t, *x, 30000ms);
  EXPECT_NE(s, transfer_state::in_flight);
  const auto until = std::chrono::steady_clock::now() + 30000ms;
  while (t->peer_alive(*p) && std::chrono::steady_clock::now() < until) {
    const std::byte ping[1] = {std::byte{2}};
    (void)t->send(*p, ping);
    t->progress();
  }
  EXPECT_FALSE(t->peer_alive(*p));
  EXPECT_EQ(t->read(*p, runs, rs, ds).code(), errc::transport_error);
  EXPECT_EQ(t->reads_in_flight(), 0U);
  std::printf("ucx: the read posted before the kill ended %s\n", s == transfer_state::done ? "done" : "failed");
}

TEST(UcxTransport, MessagesNeverReceivedGoQuietlyWithTheTransport) {
  // A peer's messages still queued when the transport goes (its connection closed before they were received) are
  // dropped: UCX would warn about each on stdout, where a tool prints its report (kvpager-sim --json).
  result<ucx_transport> a = ucx_transport::create();
  ASSERT_TRUE(a.ok()) << a.error().message();
  const result<std::uint16_t> port = a->listen("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.error().message();
  result<ucx_transport> made = ucx_transport::create();
  ASSERT_TRUE(made.ok()) << made.error().message();
  std::optional<ucx_transport> b(std::move(*made));
  std::optional<result<peer_handle>> accepted;
  std::thread acceptor([&] { accepted.emplace(a->accept(10000ms)); });
  const result<peer_handle> to_a = b->connect("127.0.0.1", *port);
  acceptor.join();
  ASSERT_TRUE(to_a.ok()) << to_a.error().message();
  ASSERT_TRUE(accepted->ok()) << accepted->error().message();
  const std::vector<std::byte> msg(64, std::byte{7});
  {
    // A send may wait for the receiving worker (its endpoint's set-up): b progresses on its own thread meanwhile, as
    // a peer in another process would, and goes on progressing a while after the disconnect, so the messages arrive
    // unexpected and nothing receives them.
    std::atomic<bool> sent{false};
    std::thread progresser([&] {
      auto until = std::chrono::steady_clock::now() + 30000ms;
      bool after = false;
      while (std::chrono::steady_clock::now() < until) {
        b->progress();
        std::this_thread::yield();
        if (!after && sent.load()) {
          after = true;
          until = std::chrono::steady_clock::now() + 300ms;
        }
      }
    });
    bool all_sent = true;
    for (int i = 0; i < 3; ++i) all_sent = a->send(**accepted, msg).ok() && all_sent;
    const bool disconnected = a->disconnect(**accepted).ok();
    sent.store(true);
    progresser.join();
    ASSERT_TRUE(all_sent);
    ASSERT_TRUE(disconnected);
  }
  ::testing::internal::CaptureStdout();
  b.reset();
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.find("not matched"), std::string::npos) << out;
}

TEST(UcxTransport, BadAddressesAndDescriptionsAreErrorsThatLeaveNothingOpen) {
  ucx_options o;
  o.connect_timeout = 3000ms;
  result<ucx_transport> t = ucx_transport::create(o);
  ASSERT_TRUE(t.ok());
  // A loopback port nobody listens on: the listener's own port, closed again.
  std::uint16_t free_port = 0;
  {
    result<ucx_transport> l = ucx_transport::create();
    free_port = *l->listen("127.0.0.1", 0);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const result<peer_handle> p = t->connect("127.0.0.1", free_port);
  EXPECT_FALSE(p.ok());
  EXPECT_TRUE(p.error().code() == errc::transport_error || p.error().code() == errc::timed_out) << p.error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(t->connect("no-such-host.invalid", 1).code(), errc::invalid_argument);
  EXPECT_EQ(t->accept(10ms).code(), errc::invalid_argument) << "not listening";
  ASSERT_TRUE(t->listen("127.0.0.1", 0).ok());
  EXPECT_EQ(t->accept(50ms).code(), errc::timed_out);
  EXPECT_EQ(t->listen("127.0.0.1", 0).code(), errc::invalid_argument) << "already listening";
  const std::byte junk[4] = {};
  EXPECT_EQ(t->import_remote(0, junk).code(), errc::transport_error);
  EXPECT_EQ(t->receive(7, *std::make_unique<std::vector<std::byte>>()).code(), errc::transport_error);
  EXPECT_EQ(t->register_memory(nullptr, 8).code(), errc::invalid_argument);
  EXPECT_EQ(t->deregister_memory(3).code(), errc::invalid_argument);
}

}  // namespace
}  // namespace kvpager
