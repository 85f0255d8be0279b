//! Element types a host passes for keys, values, queries and outputs.
use crate::geometry::Dtype;

/// A tensor element: `f32` for `Dtype::F32`, `u16` (raw bits) for `Dtype::F16` and
/// `Dtype::Bf16`. Sealed: only these two types describe the header's dtypes.
pub trait Element: Copy + Default + sealed::Sealed {
    /// Whether a buffer of this type holds elements of `dtype`.
    fn matches(dtype: Dtype) -> bool;
}

impl Element for f32 {
    fn matches(dtype: Dtype) -> bool {
        dtype == Dtype::F32
    }
}

impl Element for u16 {
    fn matches(dtype: Dtype) -> bool {
        dtype == Dtype::F16 || dtype == Dtype::Bf16
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
}
