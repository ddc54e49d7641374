#include "kv/prefix_rows.h"

namespace mkv::kv {

void PrefixRows::put(const BlockKey& key, std::vector<uint8_t> rows) {
  if (rows.size() > max_bytes_) return;
  if (auto it = map_.find(key.hash); it != map_.end()) {
    bytes_ -= it->second.rows->size();
    lru_.erase(it->second.at);
    map_.erase(it);
  }
  bytes_ += rows.size();
  lru_.push_back(key.hash);
  map_[key.hash] = Entry{key, std::make_shared<const std::vector<uint8_t>>(std::move(rows)), std::prev(lru_.end())};
  while (bytes_ > max_bytes_) {
    auto old = map_.find(lru_.front());
    bytes_ -= old->second.rows->size();
    map_.erase(old);
    lru_.pop_front();
  }
}

PrefixRows::Rows PrefixRows::get(const BlockKey& key) const {
  auto it = map_.find(key.hash);
  if (it == map_.end() || it->second.key.parent != key.parent || it->second.key.tokens != key.tokens) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second.at);
  return it->second.rows;
}

}  // namespace mkv::kv
