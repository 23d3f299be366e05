// RegisteredMemory: the public class, and the wire form of its descriptor.
#include "ferry/registered_memory.hpp"

#include <cctype>

#include "core/serializer.hpp"
#include "memory/registered_memory_impl.hpp"

namespace ferry {
namespace {

constexpr std::uint32_t kMagic = 0x314d5246;  // "FRM1"
constexpr std::uint16_t kVersion = 1;
const char* const kWhat = "RegisteredMemory descriptor";

[[noreturn]] void malformed(const std::string& why) {
  throw Error(ErrorCode::ProtocolError, std::string(kWhat) + " is malformed: " + why);
}

bool isPowerOfTwo(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// offset + size <= total, without overflow.
bool fits(std::uint64_t offset, std::uint64_t size, std::uint64_t total) {
  return offset <= total && size <= total - offset;
}

FdToken getToken(Reader& r) {
  FdToken t{};
  auto b = r.getBytes(t.size());
  std::memcpy(t.data(), b.data(), t.size());
  return t;
}

void putToken(Writer& w, const FdToken& t) { w.putBytes(std::as_bytes(std::span(t))); }

void checkServerName(const std::string& name) {
  if (name.empty() || name.size() > FdServer::kMaxNameLength)
    malformed("fd server name of " + std::to_string(name.size()) + " bytes");
  for (char c : name)
    if (!std::isgraph(static_cast<unsigned char>(c)))
      malformed("fd server name has a non-printable character");
}

}  // namespace

RegisteredMemory::RegisteredMemory() = default;
RegisteredMemory::~RegisteredMemory() = default;
RegisteredMemory::RegisteredMemory(const RegisteredMemory&) = default;
RegisteredMemory& RegisteredMemory::operator=(const RegisteredMemory&) = default;
RegisteredMemory::RegisteredMemory(RegisteredMemory&&) noexcept = default;
RegisteredMemory& RegisteredMemory::operator=(RegisteredMemory&&) noexcept = default;
RegisteredMemory::RegisteredMemory(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

bool RegisteredMemory::valid() const noexcept { return impl_ != nullptr; }
void* RegisteredMemory::data() const noexcept { return impl_ ? impl_->data : nullptr; }
std::size_t RegisteredMemory::size() const noexcept { return impl_ ? impl_->size : 0; }
int RegisteredMemory::rank() const noexcept { return impl_ ? impl_->rank : -1; }
bool RegisteredMemory::isLocal() const noexcept { return impl_ && impl_->local; }
TransportFlags RegisteredMemory::transports() const noexcept {
  return impl_ ? impl_->transports : TransportFlags{};
}
MemoryKind RegisteredMemory::kind() const noexcept {
  return impl_ && (impl_->wireKind == WireKind::FerryDevice || impl_->wireKind == WireKind::OtherDevice)
             ? MemoryKind::Device
             : MemoryKind::Host;
}
int RegisteredMemory::device() const noexcept { return impl_ ? impl_->device : -1; }

std::vector<std::byte> RegisteredMemory::serialize() const {
  if (!impl_) throw Error(ErrorCode::InvalidUsage, "serialize of an empty RegisteredMemory");
  return encodeDescriptor(*impl_);
}

RegisteredMemory RegisteredMemory::deserialize(std::span<const std::byte> bytes) {
  std::shared_ptr<Impl> impl = decodeDescriptor(bytes);
  if (impl->owner.hostHash == processIdentity().hostHash && impl->owner.token == processIdentity().token) {
    // Our own registration came back: the same state, not a second mapping.
    std::shared_ptr<Impl> mine = findLocalRegistration(impl->regId, impl->regToken);
    if (!mine)
      throw Error(ErrorCode::InvalidUsage, "a RegisteredMemory descriptor of this process (registration " +
                                               std::to_string(impl->regId) +
                                               ") came back after its memory was deregistered");
    return RegisteredMemory(std::move(mine));
  }
  importMemory(*impl);
  return RegisteredMemory(std::move(impl));
}

std::vector<std::byte> encodeDescriptor(RegisteredMemory::Impl& m) {
  Writer w;
  w.put(kMagic);
  w.put(kVersion);
  w.put(static_cast<std::uint8_t>(m.wireKind));
  w.put(m.transports.bits());
  w.put(static_cast<std::int32_t>(m.rank));
  w.put(m.owner.hostHash);
  w.put(m.owner.token);
  w.put(m.owner.pid);
  w.put(m.device);
  w.put(m.size);
  w.put(m.regId);
  putToken(w, m.regToken);
  switch (m.wireKind) {
    case WireKind::FerryDevice:
    case WireKind::FerryHost:
      // Descriptors made in this process name its fd server (started now, on first use); a peer's
      // descriptor passed on by a third party keeps the owner's.
      if (m.local && m.allocation) m.serverName = m.allocation->share();
      w.put(m.allocId);
      putToken(w, m.allocToken);
      w.put(m.allocSize);
      w.put(m.granularity);
      w.put(m.offset);
      w.putString(m.serverName);
      break;
    case WireKind::OtherDevice:
      w.put(static_cast<std::uint8_t>(m.hasIpcHandle));
      if (m.hasIpcHandle) w.putBytes(m.ipcHandle);
      w.put(m.allocSize);
      w.put(m.offset);
      break;
    case WireKind::OtherHost: break;
  }
  return std::move(w).bytes();
}

std::shared_ptr<RegisteredMemory::Impl> decodeDescriptor(std::span<const std::byte> bytes) {
  Reader r(bytes, kWhat);
  auto m = std::make_shared<RegisteredMemory::Impl>();
  if (r.get<std::uint32_t>() != kMagic) malformed("bad magic (not a RegisteredMemory)");
  if (auto v = r.get<std::uint16_t>(); v != kVersion)
    malformed("version " + std::to_string(v) + ", this build reads version " + std::to_string(kVersion));
  auto kind = r.get<std::uint8_t>();
  if (kind < 1 || kind > 4) malformed("unknown memory kind " + std::to_string(kind));
  m->wireKind = static_cast<WireKind>(kind);
  auto bits = r.get<std::uint8_t>();
  if (bits == 0 || (bits & ~TransportFlags::kAllBits) != 0)
    malformed("bad transport set 0x" + std::to_string(bits));
  m->transports = TransportFlags::fromBits(bits);
  m->rank = r.get<std::int32_t>();
  if (m->rank < 0) malformed("negative owner rank");
  m->owner.hostHash = r.get<std::uint64_t>();
  m->owner.token = r.get<std::uint64_t>();
  m->owner.pid = r.get<std::uint32_t>();
  if (m->owner.token == 0) malformed("owner process token 0");
  m->device = r.get<std::int32_t>();
  bool onDevice = m->wireKind == WireKind::FerryDevice || m->wireKind == WireKind::OtherDevice;
  if (onDevice ? m->device < 0 : m->device != -1)
    malformed("device " + std::to_string(m->device) + " for this kind");
  m->size = r.get<std::uint64_t>();
  if (m->size == 0) malformed("size 0");
  m->regId = r.get<std::uint64_t>();
  m->regToken = getToken(r);
  switch (m->wireKind) {
    case WireKind::FerryDevice:
    case WireKind::FerryHost:
      m->allocId = r.get<std::uint64_t>();
      m->allocToken = getToken(r);
      m->allocSize = r.get<std::uint64_t>();
      m->granularity = r.get<std::uint64_t>();
      m->offset = r.get<std::uint64_t>();
      m->serverName = r.getString();
      if (!isPowerOfTwo(m->granularity)) malformed("granularity " + std::to_string(m->granularity));
      if (m->allocSize == 0 || m->allocSize % m->granularity != 0)
        malformed("allocation size " + std::to_string(m->allocSize) + " is not a positive multiple of " +
                  std::to_string(m->granularity));
      checkServerName(m->serverName);
      break;
    case WireKind::OtherDevice: {
      auto has = r.get<std::uint8_t>();
      if (has > 1) malformed("bad IPC handle flag");
      m->hasIpcHandle = has == 1;
      if (m->hasIpcHandle) {
        auto h = r.getBytes(kIpcHandleBytes);
        std::memcpy(m->ipcHandle.data(), h.data(), kIpcHandleBytes);
      }
      m->allocSize = r.get<std::uint64_t>();
      m->offset = r.get<std::uint64_t>();
      break;
    }
    case WireKind::OtherHost: break;
  }
  r.expectEnd();
  if (m->wireKind != WireKind::OtherHost && !fits(m->offset, m->size, m->allocSize))
    malformed("range [" + std::to_string(m->offset) + ", +" + std::to_string(m->size) +
              ") is outside its allocation of " + std::to_string(m->allocSize) + " bytes");
  return m;
}

}  // namespace ferry
