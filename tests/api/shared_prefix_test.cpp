// Shared prefixes (issue 16): one frozen cache continued by many conversations in its context.
// The prefix's bytes count once; each conversation charges its own rows; its attention equals one
// softmax over the prefix's rows (as the prefix's policy stores them) and its own rows (as its
// policy stores them), which the reference backend's OnlineAttention computes from the rows both
// caches read back; for 'full' over 'full' that is a private copy of the prefix.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cpu/attention.h"
#include "kvsdk.h"
#include "preset_util.h"
#include "test_util.h"

using namespace kvsdk_test;

namespace {

constexpr uint32_t kLayers = 2, kQ = 4, kKv = 2, kDim = 16;
constexpr size_t kKvRow = size_t(kKv) * kDim, kQRow = size_t(kQ) * kDim;


uint64_t bytes_of(kvsdk_cache* c) {
  kvsdk_cache_stats s;
  kvsdk_cache_stats_init(&s);
  EXPECT_EQ(kvsdk_cache_stats_get(c, &s), KVSDK_OK);
  return s.bytes;
}

kvsdk_policy policy_of(const char* spec) {
  kvsdk_policy p;
  EXPECT_EQ(kvsdk_policy_parse(&p, spec), KVSDK_OK) << spec;
  p.quant_group = 8;
  p.quant_residual = 8;
  return p;
}

// Appends `n` tokens from position `first` to every layer (inputs from `seed`).
void append(kvsdk_cache* c, int32_t first, size_t n, uint32_t seed) {
  const std::vector<int32_t> pos = iota_positions(n, first);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> k = random_floats(n * kKvRow, seed + 2 * l);
    const std::vector<float> v = random_floats(n * kKvRow, seed + 2 * l + 1);
    ASSERT_EQ(kvsdk_cache_append(c, l, n, k.data(), v.data(), pos.data(), n * kKvRow * 4),
              KVSDK_OK)
        << kvsdk_last_error();
  }
}

std::vector<float> attend(kvsdk_cache* c, uint32_t layer, const std::vector<float>& q,
                          int32_t pos) {
  std::vector<float> out(kQRow);
  EXPECT_EQ(kvsdk_cache_attend(c, layer, 1, q.data(), &pos, kQRow * 4, out.data(), kQRow * 4),
            KVSDK_OK)
      << kvsdk_last_error();
  return out;
}

// The reference: one online softmax over the rows `caches` read back, in order.
std::vector<float> reference(const std::vector<kvsdk_cache*>& caches, uint32_t layer,
                             const std::vector<float>& q, int32_t pos) {
  const uint32_t group = kQ / kKv;
  std::vector<float> out(kQRow);
  for (uint32_t g = 0; g < kKv; ++g) {
    const std::vector<int32_t> row_pos(group, pos);
    kvsdk::cpu::OnlineAttention att(q.data() + size_t(g) * group * kDim, row_pos.data(), group,
                                    kDim, 1.0f / std::sqrt(float(kDim)));
    for (kvsdk_cache* c : caches) {
      size_t n = 0;
      EXPECT_EQ(kvsdk_cache_read(c, layer, g, nullptr, nullptr, nullptr, 0, &n), KVSDK_OK);
      std::vector<float> k(n * kDim), v(n * kDim);
      std::vector<int32_t> p(n);
      EXPECT_EQ(kvsdk_cache_read(c, layer, g, k.data(), v.data(), p.data(), n, &n), KVSDK_OK);
      att.add_chunk(k.data(), v.data(), p.data(), n);
    }
    att.finish(out.data() + size_t(g) * group * kDim);
  }
  return out;
}

float max_error(const std::vector<float>& got, const std::vector<float>& want) {
  float err = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return err;
}

// Within float rounding of the merge (about 1e-6 relative) plus `allowed` (the parts' own
// kernels' errors against the reference: KIVI's attention, say, runs on integer codes).
void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what, float allowed = 0.0f) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 1.0f;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  EXPECT_LE(max_error(got, want), allowed + 2e-6f * scale) << what;
}

TEST(SharedPrefix, TenConversationsPayThePrefixOnceAndSeeItAsTheirOwn) {
  ContextPtr ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  constexpr int32_t kPrefix = 512;
  CachePtr prefix = make_cache(ctx.get(), g);
  append(prefix.get(), 0, kPrefix, 7);
  ASSERT_EQ(kvsdk_cache_freeze(prefix.get()), KVSDK_OK) << kvsdk_last_error();
  const uint64_t prefix_bytes = bytes_of(prefix.get());
  std::vector<CachePtr> chats;
  uint64_t own = 0;
  for (int i = 0; i < 10; ++i) {
    kvsdk_cache* raw = nullptr;
    ASSERT_EQ(kvsdk_cache_create_on_prefix(&raw, prefix.get(), nullptr), KVSDK_OK)
        << kvsdk_last_error();
    chats.emplace_back(raw);
    append(raw, kPrefix, 20 + size_t(i), 1000 + 10 * uint32_t(i));
    own += bytes_of(raw);
  }
  EXPECT_LE(used(ctx.get()), prefix_bytes + own) << "the prefix is counted once";
  EXPECT_EQ(used(ctx.get()), prefix_bytes + own);
  // Each conversation sees exactly what a cache with its own copy of the prefix sees.
  for (int i = 0; i < 10; ++i) {
    CachePtr priv = make_cache(ctx.get(), g);
    append(priv.get(), 0, kPrefix, 7);
    append(priv.get(), kPrefix, 20 + size_t(i), 1000 + 10 * uint32_t(i));
    for (uint32_t l = 0; l < kLayers; ++l) {
      const std::vector<float> q = random_floats(kQRow, 77 + uint32_t(i));
      const int32_t pos = kPrefix + 20 + i;
      expect_close(attend(chats[size_t(i)].get(), l, q, pos), attend(priv.get(), l, q, pos),
                   "conversation " + std::to_string(i));
      // A causal query inside the prefix sees the prefix alone.
      expect_close(attend(chats[size_t(i)].get(), l, q, 100), attend(priv.get(), l, q, 100),
                   "a query at position 100");
    }
  }
  // The prefix's handle may go first: the conversations keep it alive and charged.
  prefix.reset();
  EXPECT_EQ(used(ctx.get()), prefix_bytes + own);
  const std::vector<float> q = random_floats(kQRow, 5);
  const std::vector<float> before = attend(chats[0].get(), 0, q, 600);
  chats.clear();
  EXPECT_EQ(used(ctx.get()), 0u) << "the last conversation released the prefix";
  EXPECT_FALSE(before.empty());
}

// Each prefix policy (as it stores the prefix) under each conversation policy (its own rows).
class SharedPrefixPolicies
    : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(SharedPrefixPolicies, AttentionIsOneSoftmaxOverBothPartsAsStored) {
  const auto [prefix_spec, own_spec] = GetParam();
  ContextPtr ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  const kvsdk_policy pp = policy_of(prefix_spec), op = policy_of(own_spec);
  CachePtr prefix = make_cache(ctx.get(), g, &pp);
  append(prefix.get(), 0, 64, 3);
  ASSERT_EQ(kvsdk_cache_freeze(prefix.get()), KVSDK_OK) << kvsdk_last_error();
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_create_on_prefix(&raw, prefix.get(), &op), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr chat(raw);
  CachePtr alone = make_cache(ctx.get(), g, &op);  // the same own rows, without the prefix
  append(chat.get(), 64, 40, 500);
  append(alone.get(), 64, 40, 500);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> q = random_floats(kQRow, 9 + l);
    // Each part's kernel error against the reference, alone: merging must add nothing to it.
    const float parts =
        max_error(attend(prefix.get(), l, q, 103), reference({prefix.get()}, l, q, 103)) +
        max_error(attend(alone.get(), l, q, 103), reference({alone.get()}, l, q, 103));
    expect_close(attend(chat.get(), l, q, 103), reference({prefix.get(), alone.get()}, l, q, 103),
                 std::string(prefix_spec) + " / " + own_spec, parts);
  }
  // The prefix does not change: it refuses every mutation.
  const std::vector<float> k = random_floats(kKvRow, 1);
  const int32_t p = 200;
  EXPECT_EQ(kvsdk_cache_append(prefix.get(), 0, 1, k.data(), k.data(), &p, kKvRow * 4),
            KVSDK_E_STATE);
  EXPECT_NE(std::string(kvsdk_last_error()).find("frozen"), std::string::npos);
  EXPECT_EQ(kvsdk_cache_truncate(prefix.get(), 0), KVSDK_E_STATE);
  EXPECT_EQ(kvsdk_cache_compress(prefix.get()), KVSDK_E_STATE);
  EXPECT_EQ(kvsdk_cache_set_budget(prefix.get(), 1), KVSDK_E_STATE);
  // Truncating a conversation removes its own rows only (where its policy can do it exactly).
  const kvsdk_status st = kvsdk_cache_truncate(chat.get(), 0);
  if (st != KVSDK_OK) {
    EXPECT_EQ(st, KVSDK_E_STATE) << kvsdk_last_error();
    return;
  }
  EXPECT_EQ(bytes_of(chat.get()), 0u);
  const std::vector<float> q = random_floats(kQRow, 31);
  expect_close(attend(chat.get(), 0, q, 103), attend(prefix.get(), 0, q, 103),
               "after truncating every own row");
}

const char* const kPrefixPolicies[] = {"full", "kivi", "spindlekv", "minicache", "streaming_llm"};
const char* const kOwnPolicies[] = {"full", "kivi", "h2o", "snapkv", "spindlekv", "minicache"};

INSTANTIATE_TEST_SUITE_P(
    Pairs, SharedPrefixPolicies,
    ::testing::Combine(::testing::ValuesIn(kPrefixPolicies), ::testing::ValuesIn(kOwnPolicies)),
    [](const ::testing::TestParamInfo<SharedPrefixPolicies::ParamType>& i) {
      std::string s = std::string(std::get<0>(i.param)) + "_over_" + std::get<1>(i.param);
      for (char& ch : s) {
        if (ch == '+') ch = '_';
      }
      return s;
    });

TEST(SharedPrefix, OnlyFrozenCachesOfStatelessAttentionArePrefixes) {
  ContextPtr ctx = make_context();
  const kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  CachePtr open = make_cache(ctx.get(), g);
  kvsdk_cache* out = nullptr;
  EXPECT_EQ(kvsdk_cache_create_on_prefix(&out, open.get(), nullptr), KVSDK_E_STATE);
  EXPECT_NE(std::string(kvsdk_last_error()).find("not frozen"), std::string::npos);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(kvsdk_cache_create_on_prefix(&out, nullptr, nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_create_on_prefix(nullptr, open.get(), nullptr), KVSDK_E_INVALID_ARG);
  EXPECT_EQ(kvsdk_cache_freeze(nullptr), KVSDK_E_INVALID_ARG);
  for (const char* spec : {"smallkv", "specache"}) {
    const kvsdk_policy p = policy_of(spec);
    CachePtr c = make_cache(ctx.get(), g, &p);
    EXPECT_EQ(kvsdk_cache_freeze(c.get()), KVSDK_E_UNSUPPORTED) << spec;
    EXPECT_NE(std::string(kvsdk_last_error()).find("shared prefix"), std::string::npos);
  }
  ASSERT_EQ(kvsdk_cache_freeze(open.get()), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_freeze(open.get()), KVSDK_OK) << "idempotent";
  // A fork of a conversation shares its prefix; a fork of the prefix is an open cache.
  ASSERT_EQ(kvsdk_cache_create_on_prefix(&out, open.get(), nullptr), KVSDK_OK);
  CachePtr chat(out);
  append(chat.get(), 0, 4, 1);
  kvsdk_cache* f = nullptr;
  ASSERT_EQ(kvsdk_cache_fork(&f, chat.get()), KVSDK_OK) << kvsdk_last_error();
  CachePtr branch(f);
  const std::vector<float> q = random_floats(kQRow, 2);
  EXPECT_EQ(attend(branch.get(), 1, q, 10), attend(chat.get(), 1, q, 10));
  ASSERT_EQ(kvsdk_cache_fork(&f, open.get()), KVSDK_OK);
  CachePtr reopened(f);
  append(reopened.get(), 0, 1, 3);
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "shared_prefix_" + std::to_string(getpid()) + "_" + name;
}

kvsdk_save_options save_options(bool embed) {
  kvsdk_save_options o;
  kvsdk_save_options_init(&o);
  o.embed_prefix = embed ? 1 : 0;
  return o;
}

// A frozen 'kivi' prefix of 64 tokens and one conversation on it with 30 own tokens.
struct PrefixedChat {
  ContextPtr ctx = make_context();
  kvsdk_geometry g = make_geometry(kLayers, kQ, kKv, kDim);
  CachePtr prefix, chat;
  explicit PrefixedChat(uint32_t seed = 3) {
    const kvsdk_policy pp = policy_of("kivi");
    prefix = make_cache(ctx.get(), g, &pp);
    append(prefix.get(), 0, 64, seed);
    EXPECT_EQ(kvsdk_cache_freeze(prefix.get()), KVSDK_OK);
    kvsdk_cache* raw = nullptr;
    const kvsdk_policy op = policy_of("snapkv");
    EXPECT_EQ(kvsdk_cache_create_on_prefix(&raw, prefix.get(), &op), KVSDK_OK);
    chat.reset(raw);
    append(chat.get(), 64, 30, 900);
  }
};

TEST(SharedPrefixSnapshot, AReferencingSnapshotLoadsOnlyOnItsPrefix) {
  PrefixedChat a;
  const std::string path = temp_path("ref.kvs");
  const kvsdk_save_options ref = save_options(false);
  ASSERT_EQ(kvsdk_cache_save(a.chat.get(), path.c_str(), &ref), KVSDK_OK) << kvsdk_last_error();
  kvsdk_cache* raw = nullptr;
  EXPECT_EQ(kvsdk_cache_load(&raw, a.ctx.get(), path.c_str(), nullptr, nullptr), KVSDK_E_STATE);
  EXPECT_NE(std::string(kvsdk_last_error()).find("kvsdk_cache_load_on_prefix"),
            std::string::npos)
      << kvsdk_last_error();
  EXPECT_EQ(raw, nullptr);
  // Another prefix (other tokens) is refused too.
  PrefixedChat other(4);
  EXPECT_EQ(kvsdk_cache_load_on_prefix(&raw, other.prefix.get(), path.c_str(), nullptr),
            KVSDK_E_STATE);
  EXPECT_NE(std::string(kvsdk_last_error()).find("another shared prefix"), std::string::npos);
  // A plain snapshot is not a conversation on a prefix.
  const std::string plain = temp_path("plain.kvs");
  ASSERT_EQ(kvsdk_cache_save(other.prefix.get(), plain.c_str(), &ref), KVSDK_OK);
  EXPECT_EQ(kvsdk_cache_load_on_prefix(&raw, a.prefix.get(), plain.c_str(), nullptr),
            KVSDK_E_STATE);
  // Its own prefix: the loaded conversation continues bit for bit, and only its rows are charged.
  const uint64_t before = used(a.ctx.get());
  kvsdk_load_info info;
  kvsdk_load_info_init(&info);
  ASSERT_EQ(kvsdk_cache_load_on_prefix(&raw, a.prefix.get(), path.c_str(), &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr loaded(raw);
  // 5 or later: older readers must refuse a conversation on a prefix (6: it holds exact rows).
  EXPECT_EQ(info.format_major, 6u) << "older readers must refuse a conversation on a prefix";
  EXPECT_EQ(used(a.ctx.get()), before + bytes_of(a.chat.get()));
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> q = random_floats(kQRow, 40 + l);
    EXPECT_EQ(attend(loaded.get(), l, q, 120), attend(a.chat.get(), l, q, 120));
  }
  // Journal deltas continue it: append to both, save a delta, load again.
  append(a.chat.get(), 94, 3, 77);
  ASSERT_EQ(kvsdk_cache_save(a.chat.get(), path.c_str(), &ref), KVSDK_OK);
  append(a.chat.get(), 97, 2, 78);
  ASSERT_EQ(kvsdk_cache_save_delta(a.chat.get(), path.c_str(), &ref), KVSDK_OK)
      << kvsdk_last_error();
  ASSERT_EQ(kvsdk_cache_load_on_prefix(&raw, a.prefix.get(), path.c_str(), &info), KVSDK_OK)
      << kvsdk_last_error();
  CachePtr again(raw);
  EXPECT_EQ(info.journal_frames_applied, 1u);
  const std::vector<float> q = random_floats(kQRow, 50);
  EXPECT_EQ(attend(again.get(), 1, q, 120), attend(a.chat.get(), 1, q, 120));
  // A prefix loaded from its own snapshot has the same content: it serves as well.
  const std::string prefix_path = temp_path("prefix.kvs");
  ASSERT_EQ(kvsdk_cache_save(a.prefix.get(), prefix_path.c_str(), &ref), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_load(&raw, a.ctx.get(), prefix_path.c_str(), nullptr, nullptr), KVSDK_OK);
  CachePtr reloaded_prefix(raw);
  EXPECT_EQ(kvsdk_cache_load_on_prefix(&raw, reloaded_prefix.get(), path.c_str(), nullptr),
            KVSDK_E_STATE)
      << "not frozen yet";
  ASSERT_EQ(kvsdk_cache_freeze(reloaded_prefix.get()), KVSDK_OK);
  ASSERT_EQ(kvsdk_cache_load_on_prefix(&raw, reloaded_prefix.get(), path.c_str(), nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr on_reloaded(raw);
  EXPECT_EQ(attend(on_reloaded.get(), 0, q, 120), attend(a.chat.get(), 0, q, 120));
  for (const std::string& p : {path, plain, prefix_path}) std::remove(p.c_str());
}

TEST(SharedPrefixSnapshot, AnEmbeddingSnapshotLoadsAloneWithAPrivatePrefix) {
  PrefixedChat a;
  const kvsdk_save_options embed = save_options(true);
  size_t size = 0;
  ASSERT_EQ(kvsdk_cache_save_to_buffer(a.chat.get(), &embed, nullptr, 0, &size), KVSDK_OK)
      << kvsdk_last_error();
  std::vector<uint8_t> buf(size);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(a.chat.get(), &embed, buf.data(), size, &size), KVSDK_OK);
  size_t ref_size = 0;
  const kvsdk_save_options ref = save_options(false);
  ASSERT_EQ(kvsdk_cache_save_to_buffer(a.chat.get(), &ref, nullptr, 0, &ref_size), KVSDK_OK);
  EXPECT_LT(ref_size, size) << "a reference is smaller than the embedded prefix";
  // Another context, without the prefix: the conversation loads with a private copy of it.
  ContextPtr ctx = make_context();
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_load_from_buffer(&raw, ctx.get(), buf.data(), size, nullptr, nullptr),
            KVSDK_OK)
      << kvsdk_last_error();
  CachePtr loaded(raw);
  EXPECT_EQ(used(ctx.get()), bytes_of(a.prefix.get()) + bytes_of(a.chat.get()))
      << "the private prefix is charged too";
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> q = random_floats(kQRow, 60 + l);
    EXPECT_EQ(attend(loaded.get(), l, q, 120), attend(a.chat.get(), l, q, 120));
  }
  loaded.reset();
  EXPECT_EQ(used(ctx.get()), 0u) << "the private prefix went with its conversation";
  // A damaged embedded prefix is refused, not loaded.
  kvsdk_save_options bad = embed;
  bad.embed_prefix = 2;
  EXPECT_EQ(kvsdk_cache_save_to_buffer(a.chat.get(), &bad, nullptr, 0, &size), KVSDK_E_INVALID_ARG);
}

TEST(SharedPrefix, AConversationIsNotAPrefixItself) {
  PrefixedChat a;
  EXPECT_EQ(kvsdk_cache_freeze(a.chat.get()), KVSDK_E_UNSUPPORTED);
  EXPECT_NE(std::string(kvsdk_last_error()).find("cannot itself be frozen"), std::string::npos);
}

TEST(SharedPrefix, ConversationsAttendOnTheirOwnThreads) {
  PrefixedChat a;
  kvsdk_cache* raw = nullptr;
  ASSERT_EQ(kvsdk_cache_create_on_prefix(&raw, a.prefix.get(), nullptr), KVSDK_OK);
  CachePtr b(raw);
  append(b.get(), 64, 10, 321);
  const std::vector<float> q = random_floats(kQRow, 8);
  const std::vector<float> want_a = attend(a.chat.get(), 1, q, 120);
  const std::vector<float> want_b = attend(b.get(), 1, q, 120);
  const std::vector<float> want_p = attend(a.prefix.get(), 1, q, 120);
  // Both conversations and the prefix itself attend at the same time, many times over.
  std::vector<int> wrong(3, 0);
  auto run = [&](kvsdk_cache* c, const std::vector<float>& want, int* bad) {
    for (int i = 0; i < 200; ++i) *bad += attend(c, 1, q, 120) != want;
  };
  std::thread ta(run, a.chat.get(), std::cref(want_a), &wrong[0]);
  std::thread tb(run, b.get(), std::cref(want_b), &wrong[1]);
  std::thread tp(run, a.prefix.get(), std::cref(want_p), &wrong[2]);
  ta.join();
  tb.join();
  tp.join();
  EXPECT_EQ(wrong, std::vector<int>(3, 0));
}

}  // namespace
