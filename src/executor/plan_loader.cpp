// Plan loading and validation: the same rules and messages as python/ferry/plan/load.py, which is
// the reference (the DSL and verifier use it). Type checks come before every access, so nlohmann
// never throws past this file; parse errors are caught and converted.
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "executor/plan.hpp"

namespace ferry::executor {

PlanError::PlanError(std::string p, const std::string& message, std::int64_t r, std::int64_t tb,
                     std::int64_t op, std::string k)
    : Error(ErrorCode::InvalidUsage,
            p + ": " + message + (r >= 0 ? " (rank " + std::to_string(r) + ")" : "")),
      path(std::move(p)),
      kind(std::move(k)),
      rank(r),
      threadBlock(tb),
      opIndex(op) {}

namespace {

// ordered_json keeps document order, so the first unknown field reported matches Python's dict.
using Json = nlohmann::ordered_json;
using i64 = std::int64_t;

// The plan format's collectives: ferry's, in Collective's order, but for reduce.
constexpr std::array kCollectives{"allreduce", "allgather", "reducescatter", "alltoall", "broadcast"};
static_assert(static_cast<std::size_t>(Collective::Broadcast) + 1 == kCollectives.size());
constexpr std::array kProtocols{"Simple", "LL"};
constexpr std::array kBuffers{"input", "output", "scratch"};
constexpr std::array kScratchOnly{"scratch"};
constexpr std::array kChannelTypes{"memory", "port", "switch"};
constexpr std::array kOpKinds{"put",
                              "get",
                              "signal",
                              "wait",
                              "flush",
                              "copy",
                              "reduce",
                              "put_packets",
                              "unpack_packets",
                              "reduce_packets",
                              "read_reduce_copy_send",
                              "barrier"};
// Fields of each op besides "op", indexed by OpKind; all required, no other allowed.
const std::vector<std::vector<std::string>> kOpFields{{"channel", "src", "dst"},
                                                      {"channel", "src", "dst"},
                                                      {"channel"},
                                                      {"channel"},
                                                      {"channel"},
                                                      {"src", "dst"},
                                                      {"srcs", "dst"},
                                                      {"channel", "src", "dst"},
                                                      {"src", "dst"},
                                                      {"src", "dst"},
                                                      {"srcs", "dst", "sends"},
                                                      {}};

// Products and sums of two int64 values, printed without overflow.
std::string str128(__int128 v) {
  if (v < 0) return "-" + str128(-v);
  std::string s;
  do s.insert(s.begin(), char('0' + int(v % 10)));
  while ((v /= 10) != 0);
  return s;
}

// Python's repr() of a string (what load.py's {value!r} prints), close enough for ASCII controls.
std::string pyRepr(const std::string& s) {
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\' || c == static_cast<unsigned char>(q))
      out += {'\\', char(c)};
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else
      out += char(c);
  }
  return out + q;
}

std::string pyRepr(const Json& v) {
  if (v.is_string()) return pyRepr(v.get_ref<const std::string&>());
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string kindOf(const Json& v) {
  switch (v.type()) {
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    case Json::value_t::null: return "null";
    default: return "a value";
  }
}

// Where a value sits: JSON path plus the rank, thread block and op it belongs to (-1: none).
struct Loc {
  std::string path;
  i64 rank = -1, tb = -1, op = -1;
  Loc at(std::string_view key) const {
    return {path.empty() ? std::string(key) : path + "." + std::string(key), rank, tb, op};
  }
  Loc at(i64 i) const { return {path + "[" + std::to_string(i) + "]", rank, tb, op}; }
  [[noreturn]] void fail(const std::string& message, const char* kind = "malformed") const {
    throw PlanError(path.empty() ? "plan" : path, message, rank, tb, op, kind);
  }
};

template <class Names>
std::string joined(const Names& names, const char* sep) {
  std::string s;
  for (std::string_view n : names) s += (s.empty() ? "" : sep) + std::string(n);
  return s;
}

void object(const Json& v, const Loc& loc, const std::vector<std::string>& required,
            const std::vector<std::string>& optional = {}) {
  if (!v.is_object()) loc.fail("expected an object, found " + kindOf(v));
  auto known = [&](const std::string& k) {
    return std::find(required.begin(), required.end(), k) != required.end() ||
           std::find(optional.begin(), optional.end(), k) != optional.end();
  };
  for (const auto& item : v.items())
    if (!known(item.key())) loc.at(item.key()).fail("unknown field");
  for (const auto& k : required)
    if (!v.contains(k)) loc.at(k).fail("missing field");
}

i64 integer(const Json& v, const Loc& loc, std::optional<i64> lo = std::nullopt) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(INT64_MAX))
    loc.fail(v.dump() + " is too large (this loader reads 64-bit integers)");
  if (!v.is_number_integer()) loc.fail("expected an integer, found " + kindOf(v));
  i64 x = v.get<i64>();
  if (lo && x < *lo) loc.fail(std::to_string(x) + " is below the minimum " + std::to_string(*lo));
  return x;
}

// Returns the index of the value in choices.
template <std::size_t N>
std::size_t choice(const Json& v, const Loc& loc, const std::array<const char*, N>& choices) {
  if (!v.is_string()) loc.fail("expected a string, found " + kindOf(v));
  const auto& s = v.get_ref<const std::string&>();
  for (std::size_t i = 0; i < N; ++i)
    if (s == choices[i]) return i;
  loc.fail("unknown value " + pyRepr(s) + " (expected one of " + joined(choices, ", ") + ")");
}

const Json& array(const Json& v, const Loc& loc, bool nonempty = false) {
  if (!v.is_array()) loc.fail("expected an array, found " + kindOf(v));
  if (nonempty && v.empty()) loc.fail("must not be empty");
  return v;
}

const char* typeName(ChannelType t) { return kChannelTypes[std::size_t(t)]; }

// `need`: the channel type the use requires, if any.
i64 channelIndex(const Json& v, const Loc& loc, const std::vector<Channel>& channels,
                 std::optional<ChannelType> need) {
  i64 c = integer(v, loc);
  i64 n = i64(channels.size());
  if (c < 0 || c >= n)
    loc.fail("channel " + std::to_string(c) + " does not exist (this rank has " + std::to_string(n) + ")",
             "out_of_range");
  if (need && channels[c].type != *need)
    loc.fail("channel " + std::to_string(c) + " is a " + typeName(channels[c].type) +
             " channel; this needs " + typeName(*need));
  return c;
}

// `channels` non-null where a "channel" field (a load from peer memory) is allowed.
ChunkRef chunkRef(const Json& v, const Loc& loc, const Chunks& chunks, bool scratchOnly = false,
                  const std::vector<Channel>* channels = nullptr) {
  object(v, loc, {"buffer", "index", "count"},
         channels ? std::vector<std::string>{"channel"} : std::vector<std::string>{});
  ChunkRef r;
  // The only scratch-only choice is index 0 of kScratchOnly: map it to BufferKind::Scratch.
  r.buffer =
      scratchOnly
          ? BufferKind(std::size_t(BufferKind::Scratch) + choice(v["buffer"], loc.at("buffer"), kScratchOnly))
          : BufferKind(choice(v["buffer"], loc.at("buffer"), kBuffers));
  r.index = integer(v["index"], loc.at("index"), 0);
  r.count = integer(v["count"], loc.at("count"), 1);
  i64 size = chunks.of(r.buffer);
  std::string name = kBuffers[std::size_t(r.buffer)];
  if (r.index >= size)
    loc.at("index").fail(std::to_string(r.index) + " is out of range for buffer \"" + name + "\" of " +
                             std::to_string(size) + " chunks",
                         "out_of_range");
  __int128 end = __int128(r.index) + r.count;
  if (end > size)
    loc.at("count").fail("chunks [" + std::to_string(r.index) + ", " + str128(end) + ") run past buffer \"" +
                             name + "\" of " + std::to_string(size) + " chunks",
                         "out_of_range");
  if (v.contains("channel"))
    r.channel = channelIndex(v["channel"], loc.at("channel"), *channels, ChannelType::Memory);
  return r;
}

// One op's threads copy or reduce all its chunks at once, so a local source and the local
// destination must be the same chunks (element by element in place: copy, reduce) or none in
// common; a partial overlap (scratch 1..3 copied to 0..2) is a race on the GPU. Packets have
// another layout than the data they carry, so an unpack's source and destination must not meet
// at all. (python/ferry/plan/load.py applies the same rule.)
void checkOverlap(const Op& op, const Loc& loc) {
  const bool writesLocal = op.kind == OpKind::Copy || op.kind == OpKind::Reduce ||
                           op.kind == OpKind::ReadReduceCopySend || op.kind == OpKind::UnpackPackets ||
                           op.kind == OpKind::ReducePackets;
  if (!writesLocal || !op.dst.present()) return;
  const bool packets = op.kind == OpKind::UnpackPackets || op.kind == OpKind::ReducePackets;
  std::vector<const ChunkRef*> sources;
  if (op.src.present()) sources.push_back(&op.src);
  for (const ChunkRef& r : op.srcs)
    if (r.channel == kNoChannel) sources.push_back(&r);  // one with a channel is the peer's memory
  for (const ChunkRef* s : sources) {
    if (s->buffer != op.dst.buffer) continue;
    const bool same = s->index == op.dst.index && !packets;
    const bool apart = s->index + s->count <= op.dst.index || op.dst.index + op.dst.count <= s->index;
    if (same || apart) continue;
    const std::string name = kBuffers[std::size_t(op.dst.buffer)];
    const auto range = [](const ChunkRef& r) {
      return "[" + std::to_string(r.index) + ", " + std::to_string(r.index + r.count) + ")";
    };
    loc.fail("a source " + name + range(*s) + " and the destination " + name + range(op.dst) +
             (packets ? " meet; an unpack's packets and its data must not share chunks"
                      : " overlap without being the same chunks; the op's threads would read chunks others "
                        "write (a race): use disjoint chunks, or the very same ones to work in place"));
  }
}

Op parseOp(const Json& v, const Loc& loc, const std::vector<Channel>& channels, const Chunks& chunks) {
  if (!v.is_object()) loc.fail("expected an object, found " + kindOf(v));
  if (!v.contains("op")) loc.at("op").fail("missing field");
  Op op;
  op.kind = OpKind(choice(v["op"], loc.at("op"), kOpKinds));
  std::vector<std::string> fields{"op"};
  for (const auto& f : kOpFields[std::size_t(op.kind)]) fields.push_back(f);
  object(v, loc, fields);
  std::optional<ChannelType> need;
  if (op.kind == OpKind::Get) need = ChannelType::Memory;
  if (op.kind == OpKind::Flush) need = ChannelType::Port;
  if (v.contains("channel")) op.channel = channelIndex(v["channel"], loc.at("channel"), channels, need);
  bool packetsIn = op.kind == OpKind::UnpackPackets || op.kind == OpKind::ReducePackets;
  if (v.contains("src")) op.src = chunkRef(v["src"], loc.at("src"), chunks, packetsIn);
  if (v.contains("dst")) op.dst = chunkRef(v["dst"], loc.at("dst"), chunks, op.kind == OpKind::PutPackets);
  if (v.contains("srcs")) {
    Loc sl = loc.at("srcs");
    const Json& a = array(v["srcs"], sl, true);
    for (std::size_t i = 0; i < a.size(); ++i)
      op.srcs.push_back(chunkRef(a[i], sl.at(i64(i)), chunks, false, &channels));
  }
  if (v.contains("sends")) {
    Loc sl = loc.at("sends");
    const Json& a = array(v["sends"], sl);
    for (std::size_t i = 0; i < a.size(); ++i) {
      Loc el = sl.at(i64(i));
      object(a[i], el, {"channel", "dst"});
      Send s;
      s.channel = channelIndex(a[i]["channel"], el.at("channel"), channels, std::nullopt);
      s.dst = chunkRef(a[i]["dst"], el.at("dst"), chunks);
      op.sends.push_back(s);
    }
  }
  std::set<i64> counts;
  for (const ChunkRef* r : {&op.src, &op.dst})
    if (r->present()) counts.insert(r->count);
  for (const auto& r : op.srcs) counts.insert(r.count);
  for (const auto& s : op.sends) counts.insert(s.dst.count);
  if (counts.size() > 1) {
    std::string list;
    for (i64 c : counts) list += (list.empty() ? "" : ", ") + std::to_string(c);
    loc.fail("references of one op must have the same count, found [" + list + "]");
  }
  checkOverlap(op, loc);
  return op;
}

RankPlan parseRank(const Json& v, const Loc& loc, i64 r, i64 world, const Chunks& chunks) {
  object(v, loc, {"rank", "channels", "thread_blocks"});
  RankPlan rp;
  rp.rank = integer(v["rank"], loc.at("rank"));
  if (rp.rank != r)
    loc.at("rank").fail("is " + std::to_string(rp.rank) + ", expected its position " + std::to_string(r));
  Loc cls = loc.at("channels");
  const Json& cs = array(v["channels"], cls);
  for (std::size_t i = 0; i < cs.size(); ++i) {
    Loc cl = cls.at(i64(i));
    object(cs[i], cl, {"type", "peer"});
    Channel c;
    c.type = ChannelType(choice(cs[i]["type"], cl.at("type"), kChannelTypes));
    c.peer = integer(cs[i]["peer"], cl.at("peer"));
    if (c.peer < 0 || c.peer >= world || c.peer == r)
      cl.at("peer").fail("peer " + std::to_string(c.peer) + " " +
                             (c.peer == r ? std::string("is this rank itself")
                                          : "does not exist (world_size " + std::to_string(world) + ")"),
                         "out_of_range");
    rp.channels.push_back(c);
  }
  Loc tbs = loc.at("thread_blocks");
  const Json& ts = array(v["thread_blocks"], tbs, true);
  for (std::size_t t = 0; t < ts.size(); ++t) {
    Loc tl = tbs.at(i64(t));
    tl.tb = i64(t);
    object(ts[t], tl, {"id", "ops"});
    ThreadBlock tb;
    tb.id = integer(ts[t]["id"], tl.at("id"));
    if (tb.id != i64(t))
      tl.at("id").fail("is " + std::to_string(tb.id) + ", expected its position " + std::to_string(t));
    Loc ol = tl.at("ops");
    const Json& os = array(ts[t]["ops"], ol);
    for (std::size_t k = 0; k < os.size(); ++k) {
      Loc l = ol.at(i64(k));
      l.op = i64(k);
      tb.ops.push_back(parseOp(os[k], l, rp.channels, chunks));
    }
    rp.threadBlocks.push_back(std::move(tb));
  }
  return rp;
}

Chunks parseChunks(const Json& v, const Loc& loc, Collective coll, i64 world) {
  object(v, loc, {"input", "output", "scratch"});
  Chunks c{integer(v["input"], loc.at("input"), 1), integer(v["output"], loc.at("output"), 1),
           integer(v["scratch"], loc.at("scratch"), 0)};
  // The collective fixes how output relates to input; the verifier's expected result needs it.
  __int128 wIn = __int128(world) * c.input, wOut = __int128(world) * c.output;
  if (coll == Collective::AllGather && c.output != wIn)
    loc.at("output").fail("allgather needs world_size * input = " + str128(wIn) + " chunks, found " +
                          std::to_string(c.output));
  if (coll == Collective::ReduceScatter && c.input != wOut)
    loc.at("input").fail("reducescatter needs world_size * output = " + str128(wOut) + " chunks, found " +
                         std::to_string(c.input));
  bool same = coll == Collective::AllReduce || coll == Collective::AllToAll || coll == Collective::Broadcast;
  if (same && c.output != c.input)
    loc.at("output").fail(std::string(kCollectives[std::size_t(coll)]) +
                          " needs as many output chunks as input (" + std::to_string(c.input) + "), found " +
                          std::to_string(c.output));
  if (coll == Collective::AllToAll && c.input % world)
    loc.at("input").fail("alltoall needs a multiple of world_size " + std::to_string(world) + ", found " +
                         std::to_string(c.input));
  return c;
}

// Every channel needs its pair: as many (type) channels from r to p as from p to r.
void checkPairs(const Plan& plan, const Loc& loc) {
  std::map<std::tuple<i64, i64, ChannelType>, i64> counts;
  for (const auto& r : plan.ranks)
    for (const auto& c : r.channels) ++counts[{r.rank, c.peer, c.type}];
  for (const auto& r : plan.ranks)
    for (std::size_t i = 0; i < r.channels.size(); ++i) {
      const Channel& c = r.channels[i];
      i64 mine = counts[{r.rank, c.peer, c.type}], theirs = counts[{c.peer, r.rank, c.type}];
      if (mine == theirs) continue;
      Loc l = loc.at(r.rank).at("channels").at(i64(i));
      l.rank = r.rank;
      std::string t = typeName(c.type), p = std::to_string(c.peer);
      l.fail(t + " channel to rank " + p + " has no pair: this rank has " + std::to_string(mine) + " " + t +
             " channels to rank " + p + ", rank " + p + " has " + std::to_string(theirs) + " back");
    }
}

Plan parsePlan(const Json& doc) {
  Loc loc;
  object(doc, loc,
         {"format", "version", "name", "collective", "protocol", "inplace", "world_size", "chunks",
          "min_bytes", "max_bytes", "ranks"},
         {"root"});
  if (doc["format"] != "ferry-plan")
    loc.at("format").fail("expected 'ferry-plan', found " + pyRepr(doc["format"]));
  i64 version = integer(doc["version"], loc.at("version"));
  if (version != 1)
    loc.at("version").fail("version " + std::to_string(version) + " is not supported (this loader reads 1)");
  Plan plan;
  if (!doc["name"].is_string()) loc.at("name").fail("expected a string, found " + kindOf(doc["name"]));
  plan.name = doc["name"].get<std::string>();
  plan.collective = Collective(choice(doc["collective"], loc.at("collective"), kCollectives));
  plan.protocol = Protocol(choice(doc["protocol"], loc.at("protocol"), kProtocols));
  if (!doc["inplace"].is_boolean())
    loc.at("inplace").fail("expected a boolean, found " + kindOf(doc["inplace"]));
  plan.inplace = doc["inplace"].get<bool>();
  plan.worldSize = integer(doc["world_size"], loc.at("world_size"), 1);
  plan.chunks = parseChunks(doc["chunks"], loc.at("chunks"), plan.collective, plan.worldSize);
  plan.minBytes = integer(doc["min_bytes"], loc.at("min_bytes"), 0);
  plan.maxBytes = integer(doc["max_bytes"], loc.at("max_bytes"), 0);
  if (plan.maxBytes < plan.minBytes)
    loc.at("max_bytes")
        .fail(std::to_string(plan.maxBytes) + " is below min_bytes " + std::to_string(plan.minBytes));
  std::string coll = kCollectives[std::size_t(plan.collective)];
  if (plan.collective == Collective::Broadcast) {
    if (!doc.contains("root")) loc.at("root").fail("missing field (required for broadcast)");
    plan.root = integer(doc["root"], loc.at("root"), 0);
    if (plan.root >= plan.worldSize)
      loc.at("root").fail("rank " + std::to_string(plan.root) + " does not exist (world_size " +
                              std::to_string(plan.worldSize) + ")",
                          "out_of_range");
  } else if (doc.contains("root")) {
    loc.at("root").fail("only broadcast has a root, not " + coll);
  }
  Loc rl = loc.at("ranks");
  const Json& rs = array(doc["ranks"], rl);
  if (i64(rs.size()) != plan.worldSize)
    rl.fail("has " + std::to_string(rs.size()) + " entries, world_size is " + std::to_string(plan.worldSize));
  for (std::size_t r = 0; r < rs.size(); ++r) {
    Loc l = rl.at(i64(r));
    l.rank = i64(r);
    plan.ranks.push_back(parseRank(rs[r], l, i64(r), plan.worldSize, plan.chunks));
  }
  checkPairs(plan, rl);
  return plan;
}

// What a plan may be, so that a hostile file costs a bounded amount of memory and time before its
// error (python/ferry/plan/load.py has the same size bound). A plan nests a few levels deep; JSON
// nested deeper than kMaxDepth would cost memory per level before any field is checked.
constexpr std::uint64_t kMaxPlanBytes = 64 << 20;
constexpr int kMaxDepth = 64;

void checkNesting(std::string_view text, const std::string& source) {
  int depth = 0;
  bool inString = false, escaped = false;
  for (char c : text) {
    if (inString) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') inString = false;
      continue;
    }
    if (c == '"') inString = true;
    else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth)
        throw PlanError(source, "not valid JSON: nested more than " + std::to_string(kMaxDepth) + " levels deep", -1,
                        -1, -1, "malformed");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

Plan parseText(std::string_view text, const std::string& source) {
  // Python's json refuses a byte-order mark; nlohmann would skip it.
  if (text.starts_with("\xEF\xBB\xBF"))
    throw PlanError(source, "not valid JSON: unexpected UTF-8 BOM", -1, -1, -1, "malformed");
  if (text.size() > kMaxPlanBytes)
    throw PlanError(source, std::to_string(text.size()) + " bytes, more than a plan may have (" +
                                std::to_string(kMaxPlanBytes) + ")", -1, -1, -1, "malformed");
  checkNesting(text, source);
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    auto p = what.find("] ");
    throw PlanError(source, "not valid JSON: " + (p == std::string::npos ? what : what.substr(p + 2)), -1, -1,
                    -1, "malformed");
  }
  try {
    return parsePlan(doc);
  } catch (const Json::exception& e) {
    // Unreachable by construction (types are checked first); kept so no nlohmann exception escapes.
    throw PlanError("plan", std::string("internal JSON error: ") + e.what(), -1, -1, -1, "malformed");
  }
}

}  // namespace

Plan loadPlan(std::string_view json) { return parseText(json, "plan"); }

Plan loadPlanFile(const std::string& path) {
  // Looked at before it is opened: opening a FIFO would wait for a writer, and /dev/zero never ends.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw PlanError(path, std::string("cannot read: ") + std::strerror(errno), -1, -1, -1, "malformed");
  if (!S_ISREG(st.st_mode)) throw PlanError(path, "not a regular file", -1, -1, -1, "malformed");
  if (static_cast<std::uint64_t>(st.st_size) > kMaxPlanBytes)
    throw PlanError(path, std::to_string(st.st_size) + " bytes, more than a plan may have (" +
                              std::to_string(kMaxPlanBytes) + ")", -1, -1, -1, "malformed");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw PlanError(path, std::string("cannot read: ") + std::strerror(errno), -1, -1, -1, "malformed");
  std::string text(static_cast<std::size_t>(st.st_size) + 1, '\0');  // + 1: a file that grew since
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw PlanError(path, "cannot read: read error", -1, -1, -1, "malformed");
  text.resize(static_cast<std::size_t>(in.gcount()));
  return parseText(text, path);
}

}  // namespace ferry::executor
