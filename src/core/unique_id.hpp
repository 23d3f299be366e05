#pragma once
// What a UniqueId holds, and the listening sockets that UniqueId::create reserved for the root.
#include <optional>

#include "core/bootstrap_wire.hpp"
#include "core/socket.hpp"
#include "ferry/bootstrap.hpp"

namespace ferry {

struct UniqueIdContents {
  wire::Secret secret{};
  SocketAddress root;
};

UniqueIdContents decodeUniqueId(const UniqueId& id);

// UniqueId::create binds the root's port at once (so no other process can take it between create
// and init) and parks the socket here until this process's rank 0 adopts it. A process that forks
// after create() holds a copy in every child; ranks other than 0 drop theirs. A process that
// spawns its ranks (no fork) gives its reservation up (UniqueId::releaseRootPort; ferry's Python
// does so when it pickles an id), or the rank 0 it spawned could not bind the port.
std::optional<Socket> takeReservedRootListener(const wire::Secret& secret);
void dropReservedRootListener(const wire::Secret& secret);

}  // namespace ferry
