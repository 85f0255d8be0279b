#include "core/store_view.h"

#include "core/representation.h"

namespace kvsdk {

StoreLayout::StoreLayout(const Geometry& geometry, const kvsdk_policy& policy)
    : geometry_(geometry),
      policy_(policy),
      repr_(make_representation(geometry, policy)),
      rows_(make_row_store(geometry, policy)) {}

StoreLayout::~StoreLayout() = default;

const Representation& StoreLayout::store(uint32_t layer) const {
  return repr_ && repr_->covers(layer) ? *repr_ : *rows_;
}

bool StoreLayout::exact_rows(uint32_t layer) const {
  return store(layer).exact_rows(layer, 0) != nullptr;
}

void StoreLayout::validate(uint32_t layer, const std::vector<TierRecord>& records) const {
  // A fresh store of the same kind: restore() may keep partial state when it throws.
  std::unique_ptr<Representation> scratch =
      repr_ && repr_->covers(layer) ? make_representation(geometry_, policy_)
                                    : make_row_store(geometry_, policy_);
  scratch->restore(layer, records);
}

}  // namespace kvsdk
