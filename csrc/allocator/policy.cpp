#include "allocator/policy.h"

namespace umbp {

const AllocatorPolicy& UmbpSimPolicy() {
  static const AllocatorPolicy p{
      "umbp-sim",
      AllocatorPolicy::PopulateFailure::UnmapThenDemoteOrFail,
      /*check_possible_nodes=*/true,
      AllocatorPolicy::Maxnode::NodePlusTwo,
      /*cap_nodemask=*/true,
      /*hugepage_size_above_base_page=*/true,
      /*free_trusts_handle=*/false,
      /*mori_texts=*/false,
      /*one_hugetlb_warning_per_process=*/false,
      /*exceptions_escape=*/false,
      /*register_shm_before_policies=*/false,
      /*map_hugetlb_on_memfd=*/false,
  };
  return p;
}

const AllocatorPolicy& Mori624002cPolicy() {
  static const AllocatorPolicy p{
      "mori-624002c",
      AllocatorPolicy::PopulateFailure::TouchByHand,
      /*check_possible_nodes=*/false,
      AllocatorPolicy::Maxnode::WordBits,
      /*cap_nodemask=*/false,
      /*hugepage_size_above_base_page=*/false,
      /*free_trusts_handle=*/true,
      /*mori_texts=*/true,
      /*one_hugetlb_warning_per_process=*/true,
      /*exceptions_escape=*/true,
      /*register_shm_before_policies=*/true,
      /*map_hugetlb_on_memfd=*/true,
  };
  return p;
}

const AllocatorPolicy* PolicyByName(const std::string& name) {
  if (name == "umbp-sim") return &UmbpSimPolicy();
  if (name == "mori-624002c" || name == "mori") return &Mori624002cPolicy();
  return nullptr;
}

std::vector<std::string> PolicyNames() { return {"umbp-sim", "mori-624002c"}; }

}  // namespace umbp
