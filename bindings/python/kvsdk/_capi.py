"""Raw ctypes declarations of the kvsdk C ABI, mirroring include/kvsdk.h section by section.

Read the header for every contract; this module adds none. C enums are plain ints. Adding a
function to the header: add a line to _FUNCTIONS in the matching section
(tests/bindings/header_coverage_test.py fails until every KVSDK_API function is declared here).

The library is found through, in order: KVSDK_LIBRARY (path of libkvsdk.so), KVSDK_LIB_DIR (the
folder holding it, e.g. build/dev), the system search path (ctypes.util.find_library).
"""
import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char_p, c_double, c_float, c_int32, c_size_t, c_uint32,
                    c_uint64, c_void_p)

# ----- Version -------------------------------------------------------------------------------
KVSDK_VERSION_MAJOR = 0
KVSDK_VERSION_MINOR = 1
KVSDK_VERSION_PATCH = 0
KVSDK_VERSION_NUMBER = KVSDK_VERSION_MAJOR * 10000 + KVSDK_VERSION_MINOR * 100 + KVSDK_VERSION_PATCH

# ----- Status codes --------------------------------------------------------------------------
KVSDK_OK = 0

# ----- Context -------------------------------------------------------------------------------
class kvsdk_context_options(Structure):
    _fields_ = [("struct_size", c_uint32), ("backend", c_int32), ("device", c_int32),
                ("budget_bytes", c_uint64), ("n_threads", c_int32)]

# ----- Geometry ------------------------------------------------------------------------------
class kvsdk_geometry(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_layers", c_uint32), ("n_q_heads", c_uint32),
                ("n_kv_heads", c_uint32), ("head_dim", c_uint32), ("dtype", c_int32),
                ("rope_style", c_int32), ("rope_theta", c_float), ("attn_scale", c_float)]

# ----- Policy --------------------------------------------------------------------------------
KVSDK_METHOD_COUNT = 11
# kvsdk_policy.quant_residual: the KIVI window chosen by length (kvsdk.h).
KVSDK_QUANT_RESIDUAL_AUTO = -1

class kvsdk_policy(Structure):
    _fields_ = [("struct_size", c_uint32), ("method", c_int32), ("quant_bits", c_int32),
                ("quant_group", c_int32), ("quant_residual", c_int32),
                ("sink_tokens", c_int32), ("recent_tokens", c_int32), ("obs_window", c_int32),
                ("pool_kernel", c_int32), ("pool_kind", c_int32), ("heavy_ratio", c_float),
                ("schedule_alpha", c_float), ("schedule_beta", c_float),
                ("boundary_layer", c_int32), ("merge_t", c_float), ("retain_ratio", c_float),
                ("fetch_tokens", c_int32), ("match_tokens", c_int32),
                ("evict_slack", c_float), ("kivi_weight_bits", c_int32)]

# ----- Cache ---------------------------------------------------------------------------------
KVSDK_MAX_POSITION = 2147483646  # every position lies in 0 .. KVSDK_MAX_POSITION

# ----- Compression ---------------------------------------------------------------------------
KVSDK_ALLOC_TOTAL_TOKENS = 0
KVSDK_ALLOC_TARGET_RETENTION = 1

# ----- Stats ---------------------------------------------------------------------------------
KVSDK_TIER_SLOTS = 8

class kvsdk_cache_stats(Structure):
    _fields_ = [("struct_size", c_uint32), ("n_layers", c_uint32), ("tokens", c_uint64),
                ("appended_tokens", c_uint64), ("bytes", c_uint64),
                ("bytes_by_tier", c_uint64 * KVSDK_TIER_SLOTS), ("full_bytes", c_uint64),
                ("backing_bytes", c_uint64), ("budget_bytes", c_uint64),
                ("context_used_bytes", c_uint64), ("device_arena_bytes", c_uint64),
                ("device_reserved_bytes", c_uint64)]

class kvsdk_layer_stats(Structure):
    _fields_ = [("struct_size", c_uint32), ("layer", c_uint32), ("tokens", c_uint64),
                ("tokens_min_head", c_uint64), ("tokens_max_head", c_uint64),
                ("appended_tokens", c_uint64), ("bytes", c_uint64),
                ("bytes_by_tier", c_uint64 * KVSDK_TIER_SLOTS)]

# ----- Snapshots -----------------------------------------------------------------------------
KVSDK_SNAPSHOT_FORMAT_MAJOR = 6
KVSDK_SNAPSHOT_FORMAT_MINOR = 0

class kvsdk_save_options(Structure):
    _fields_ = [("struct_size", c_uint32), ("zstd_level", c_int32),
                ("include_backing", c_uint32), ("max_frame_bytes", c_uint64),
                ("max_journal_percent", c_uint32), ("embed_prefix", c_uint32),
                ("target_policy", POINTER(kvsdk_policy)), ("target_budget_bytes", c_uint64)]

class kvsdk_load_info(Structure):
    _fields_ = [("struct_size", c_uint32), ("format_major", c_uint32),
                ("format_minor", c_uint32), ("journal_frames_applied", c_uint32),
                ("journal_frames_dropped", c_uint32)]

# Opaque handles travel as void pointers.
handle = c_void_p
status = c_int32

# ----- Functions, in header order: name -> (restype, argtypes) -------------------------------
_FUNCTIONS = {
    # Version
    "kvsdk_version": (c_uint32, []),
    "kvsdk_version_string": (c_char_p, []),
    # Status codes and errors
    "kvsdk_status_str": (c_char_p, [c_int32]),
    "kvsdk_last_error": (c_char_p, []),
    # Context
    "kvsdk_context_options_init_sized": (status, [POINTER(kvsdk_context_options), c_size_t]),
    "kvsdk_context_create": (status, [POINTER(handle), POINTER(kvsdk_context_options)]),
    "kvsdk_context_destroy": (None, [handle]),
    "kvsdk_context_used_bytes": (status, [handle, POINTER(c_uint64)]),
    "kvsdk_context_budget_bytes": (status, [handle, POINTER(c_uint64)]),
    # Geometry
    "kvsdk_geometry_init_sized": (status, [POINTER(kvsdk_geometry), c_size_t]),
    # Policy
    "kvsdk_policy_init_sized": (status, [POINTER(kvsdk_policy), c_size_t, c_int32]),
    "kvsdk_policy_parse_sized": (status, [POINTER(kvsdk_policy), c_size_t, c_char_p]),
    "kvsdk_method_name": (c_char_p, [c_int32]),
    # Cache
    "kvsdk_cache_create": (status, [POINTER(handle), handle, POINTER(kvsdk_geometry),
                                    POINTER(kvsdk_policy)]),
    "kvsdk_cache_destroy": (None, [handle]),
    "kvsdk_cache_fork": (status, [POINTER(handle), handle]),
    "kvsdk_cache_truncate": (status, [handle, c_int32]),
    "kvsdk_cache_freeze": (status, [handle]),
    "kvsdk_cache_create_on_prefix": (status, [POINTER(handle), handle, POINTER(kvsdk_policy)]),
    "kvsdk_cache_geometry": (status, [handle, POINTER(kvsdk_geometry)]),
    "kvsdk_cache_append": (status, [handle, c_uint32, c_size_t, c_void_p, c_void_p,
                                    POINTER(c_int32), c_size_t]),
    "kvsdk_cache_attend": (status, [handle, c_uint32, c_size_t, c_void_p, POINTER(c_int32),
                                    c_size_t, c_void_p, c_size_t]),
    "kvsdk_cache_read": (status, [handle, c_uint32, c_uint32, c_void_p, c_void_p,
                                  POINTER(c_int32), c_size_t, POINTER(c_size_t)]),
    # Compression: observe, compress, plan
    "kvsdk_cache_observe": (status, [handle, c_uint32, c_size_t, c_void_p, POINTER(c_int32),
                                     c_size_t]),
    "kvsdk_cache_compress": (status, [handle]),
    "kvsdk_cache_set_budget": (status, [handle, c_uint64]),
    "kvsdk_cache_token_capacity": (status, [handle, POINTER(c_uint64), POINTER(c_uint64)]),
    "kvsdk_cache_allocation": (status, [handle, POINTER(c_uint64), c_uint32]),
    "kvsdk_cache_set_allocation": (status, [handle, POINTER(c_uint64), c_uint32]),
    "kvsdk_plan_allocation": (status, [c_uint32, POINTER(POINTER(c_float)), POINTER(c_size_t),
                                       c_int32, c_double, POINTER(c_uint64)]),
    "kvsdk_profile_create": (status, [POINTER(handle), c_uint32]),
    "kvsdk_profile_destroy": (None, [handle]),
    "kvsdk_profile_record": (status, [handle, POINTER(c_uint64), c_uint32]),
    "kvsdk_profile_shares": (status, [handle, POINTER(c_double), c_uint32, POINTER(c_uint32)]),
    "kvsdk_profile_save": (status, [handle, c_char_p]),
    "kvsdk_profile_load": (status, [POINTER(handle), c_char_p]),
    "kvsdk_cache_apply_profile": (status, [handle, handle]),
    "kvsdk_planner_create": (status, [POINTER(handle), POINTER(kvsdk_geometry),
                                      POINTER(kvsdk_policy)]),
    "kvsdk_planner_destroy": (None, [handle]),
    "kvsdk_planner_feed_layer": (status, [handle, c_uint32, c_size_t, c_void_p, POINTER(c_int32),
                                          c_size_t, c_size_t, c_void_p, POINTER(c_int32),
                                          c_size_t]),
    "kvsdk_planner_finish": (status, [handle, c_int32, c_double, POINTER(c_uint64), c_uint32]),
    # SpeCache: speculative prefetch and the off-budget backing store
    "kvsdk_cache_set_backing_file": (status, [handle, c_char_p]),
    "kvsdk_cache_prefetch": (status, [handle, c_uint32, c_size_t, c_void_p, POINTER(c_int32),
                                      c_size_t]),
    "kvsdk_cache_fetch_stats": (status, [handle, POINTER(c_double), POINTER(c_uint64)]),
    # Stats
    "kvsdk_cache_stats_init_sized": (status, [POINTER(kvsdk_cache_stats), c_size_t]),
    "kvsdk_layer_stats_init_sized": (status, [POINTER(kvsdk_layer_stats), c_size_t]),
    "kvsdk_cache_stats_get": (status, [handle, POINTER(kvsdk_cache_stats)]),
    "kvsdk_cache_layer_stats_get": (status, [handle, c_uint32, POINTER(kvsdk_layer_stats)]),
    # SmallKV
    "kvsdk_cache_set_proxy": (status, [handle, handle]),
    "kvsdk_cache_set_proxy_wait": (status, [handle, c_uint32]),
    # Snapshots
    "kvsdk_save_options_init_sized": (status, [POINTER(kvsdk_save_options), c_size_t]),
    "kvsdk_load_info_init_sized": (status, [POINTER(kvsdk_load_info), c_size_t]),
    "kvsdk_cache_save": (status, [handle, c_char_p, POINTER(kvsdk_save_options)]),
    "kvsdk_cache_save_to_buffer": (status, [handle, POINTER(kvsdk_save_options), c_void_p,
                                            c_size_t, POINTER(c_size_t)]),
    "kvsdk_cache_save_delta": (status, [handle, c_char_p, POINTER(kvsdk_save_options)]),
    "kvsdk_cache_load": (status, [POINTER(handle), handle, c_char_p, POINTER(kvsdk_geometry),
                                  POINTER(kvsdk_load_info)]),
    "kvsdk_cache_load_on_prefix": (status, [POINTER(handle), handle, c_char_p,
                                            POINTER(kvsdk_load_info)]),
    "kvsdk_cache_load_from_buffer": (status, [POINTER(handle), handle, c_void_p, c_size_t,
                                              POINTER(kvsdk_geometry), POINTER(kvsdk_load_info)]),
    "kvsdk_cache_policy": (status, [handle, POINTER(kvsdk_policy)]),
}


def _find_library():
    explicit = os.environ.get("KVSDK_LIBRARY")
    if explicit:
        return explicit
    lib_dir = os.environ.get("KVSDK_LIB_DIR")
    if lib_dir:
        return os.path.join(lib_dir, "libkvsdk.so")
    found = ctypes.util.find_library("kvsdk")
    if found:
        return found
    raise OSError("kvsdk: libkvsdk not found; set KVSDK_LIBRARY to its path or KVSDK_LIB_DIR "
                  "to its folder (e.g. build/dev)")


def _load():
    lib = ctypes.CDLL(_find_library())
    for name, (restype, argtypes) in _FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()
