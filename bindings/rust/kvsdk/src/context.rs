//! Context: a backend and a memory budget shared by the caches created on it.
use crate::error::{check, Result};
use crate::sys;
use std::mem::size_of;
use std::ptr::NonNull;

/// Where cache storage lives and attention runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The optimized CPU kernels (SIMD chosen at run time; the same bits on every machine).
    Cpu,
    Cuda,
    /// The scalar reference kernels (the oracle; slower).
    CpuReference,
    Unknown(i32),
}

impl Backend {
    pub fn from_raw(raw: i32) -> Backend {
        match raw {
            sys::KVSDK_BACKEND_CPU => Backend::Cpu,
            sys::KVSDK_BACKEND_CUDA => Backend::Cuda,
            sys::KVSDK_BACKEND_CPU_REFERENCE => Backend::CpuReference,
            other => Backend::Unknown(other),
        }
    }
    pub fn raw(self) -> i32 {
        match self {
            Backend::Cpu => sys::KVSDK_BACKEND_CPU,
            Backend::Cuda => sys::KVSDK_BACKEND_CUDA,
            Backend::CpuReference => sys::KVSDK_BACKEND_CPU_REFERENCE,
            Backend::Unknown(v) => v,
        }
    }
}

/// Context options (`kvsdk_context_options`). `Default` is kvsdk_context_options_init's
/// (CPU, device 0, unlimited budget, every core).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextOptions {
    pub backend: Backend,
    pub device: i32,
    /// Hard limit on cache storage bytes over every cache of the context; 0 = unlimited.
    pub budget_bytes: u64,
    /// Threads the kernels run on, the caller's included: 0 = every core, 1 = the caller only.
    pub n_threads: i32,
}

impl Default for ContextOptions {
    fn default() -> Self {
        let mut raw = sys::kvsdk_context_options::default();
        // SAFETY: valid pointer; cannot fail for a non-NULL argument.
        let size = size_of::<sys::kvsdk_context_options>();
        check(unsafe { sys::kvsdk_context_options_init_sized(&mut raw, size) })
            .expect("kvsdk_context_options_init_sized");
        ContextOptions::from_raw(&raw)
    }
}

impl ContextOptions {
    pub fn from_raw(raw: &sys::kvsdk_context_options) -> ContextOptions {
        ContextOptions {
            backend: Backend::from_raw(raw.backend),
            device: raw.device,
            budget_bytes: raw.budget_bytes,
            n_threads: raw.n_threads,
        }
    }
    pub fn to_raw(&self) -> sys::kvsdk_context_options {
        sys::kvsdk_context_options {
            struct_size: std::mem::size_of::<sys::kvsdk_context_options>() as u32,
            backend: self.backend.raw(),
            device: self.device,
            budget_bytes: self.budget_bytes,
            n_threads: self.n_threads,
        }
    }
}

/// An owned context. Caches keep the underlying context alive, so a `Context` may be dropped
/// while caches created on it are still in use.
#[derive(Debug)]
pub struct Context {
    raw: NonNull<sys::kvsdk_context>,
}

// SAFETY: the header declares kvsdk_context thread-safe: it may be used and released from any
// thread, concurrently.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    pub fn new(options: &ContextOptions) -> Result<Context> {
        let raw_options = options.to_raw();
        let mut out = std::ptr::null_mut();
        // SAFETY: valid pointers.
        check(unsafe { sys::kvsdk_context_create(&mut out, &raw_options) })?;
        Ok(Context { raw: NonNull::new(out).expect("kvsdk_context_create returned NULL") })
    }

    /// A CPU context with the given budget (0 = unlimited).
    pub fn with_budget(budget_bytes: u64) -> Result<Context> {
        Context::new(&ContextOptions { budget_bytes, ..Default::default() })
    }

    /// Bytes currently charged against the budget by all caches of the context.
    pub fn used_bytes(&self) -> Result<u64> {
        let mut bytes = 0;
        // SAFETY: live handle, valid pointer.
        check(unsafe { sys::kvsdk_context_used_bytes(self.raw.as_ptr(), &mut bytes) })?;
        Ok(bytes)
    }

    /// The budget in bytes (0 = unlimited).
    pub fn budget_bytes(&self) -> Result<u64> {
        let mut bytes = 0;
        // SAFETY: live handle, valid pointer.
        check(unsafe { sys::kvsdk_context_budget_bytes(self.raw.as_ptr(), &mut bytes) })?;
        Ok(bytes)
    }

    /// The raw handle, still owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::kvsdk_context {
        self.raw.as_ptr()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: owned handle, released once.
        unsafe { sys::kvsdk_context_destroy(self.raw.as_ptr()) }
    }
}
