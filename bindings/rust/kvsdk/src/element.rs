//! Element types a host passes for keys, values, queries and outputs, and the half-precision
//! element types [`F16`] and [`Bf16`].
//!
//! The C ABI takes every tensor in the cache's own dtype and converts nothing, so neither does
//! this crate: each dtype has exactly one element type, and a slice of another element type is
//! refused with [`Status::InvalidArg`](crate::Status) before the library is called (the message
//! names both, e.g. "keys: expected kvsdk::F16 elements for an F16 cache, got f32"):
//!
//! | cache dtype    | element type   |
//! |----------------|----------------|
//! | `Dtype::F32`   | `f32`          |
//! | `Dtype::F16`   | [`F16`]        |
//! | `Dtype::Bf16`  | [`Bf16`]       |
//!
//! Other types (`f64`, integers, and `u16`, whose bits could be either half type) are not
//! elements, so passing them does not compile:
//!
//! ```compile_fail,E0277
//! # use kvsdk::{Cache, Context, Geometry, Policy};
//! # let ctx = Context::with_budget(0)?;
//! # let mut cache = Cache::new(&ctx, &Geometry::new(1, 1, 1, 4), &Policy::parse("full")?)?;
//! cache.append(0, &[0.5f64; 4], &[0.5f64; 4], &[0])?; // f64 is no kvsdk::Element
//! # Ok::<(), kvsdk::Error>(())
//! ```
//!
//! ```compile_fail,E0277
//! # use kvsdk::{Cache, Context, Geometry, Policy};
//! # let ctx = Context::with_budget(0)?;
//! # let mut cache = Cache::new(&ctx, &Geometry::new(1, 1, 1, 4), &Policy::parse("full")?)?;
//! cache.append(0, &[0x3c00u16; 4], &[0x3c00u16; 4], &[0])?; // raw u16: say F16 or Bf16
//! # Ok::<(), kvsdk::Error>(())
//! ```
//!
//! Raw `u16` bit patterns become elements explicitly, without copying:
//! [`F16::from_bits_slice`] / [`Bf16::from_bits_slice`] (and `to_bits_slice` back). Hosts that
//! hold `f32` data convert it with [`F16::from_f32`] / [`Bf16::from_f32`], which round to
//! nearest even exactly like the C library (`src/util/half.h`), NaN included.
//!
//! ```
//! use kvsdk::{Bf16, Cache, Context, Dtype, Geometry, Policy, Status, F16};
//! let ctx = Context::with_budget(0)?;
//! let g = Geometry { dtype: Dtype::F16, ..Geometry::new(1, 1, 1, 4) };
//! let mut cache = Cache::new(&ctx, &g, &Policy::parse("full")?)?;
//! let k: Vec<F16> =
//!     [0.3457f32, 0.822, 0.3303, -1.303].iter().map(|&x| F16::from_f32(x)).collect();
//! cache.append(0, &k, &k, &[0])?;
//! assert_eq!(cache.read::<F16>(0, 0)?.keys, k); // bit-identical
//! let err = cache.append(0, &[0.5f32; 4], &[0.5f32; 4], &[1]).unwrap_err();
//! assert_eq!(err.status, Status::InvalidArg);
//! assert!(err.message.contains("expected kvsdk::F16 elements for an F16 cache, got f32"));
//! let bits = [0x3c00u16; 4]; // explicit: these bits are binary16
//! cache.append(0, F16::from_bits_slice(&bits), F16::from_bits_slice(&bits), &[1])?;
//! assert_eq!(Bf16::from_f32(1.0).to_bits(), 0x3f80);
//! # Ok::<(), kvsdk::Error>(())
//! ```
use crate::geometry::Dtype;
use std::fmt;

/// A tensor element of exactly one cache dtype (see the module docs): `f32` for
/// `Dtype::F32`, [`F16`] for `Dtype::F16`, [`Bf16`] for `Dtype::Bf16`. Sealed.
pub trait Element: Copy + Default + PartialEq + fmt::Debug + sealed::Sealed {
    /// The cache dtype whose elements this type holds.
    const DTYPE: Dtype;
    /// How error messages name this type.
    const NAME: &'static str;

    /// Whether a buffer of this type holds elements of `dtype`.
    fn matches(dtype: Dtype) -> bool {
        dtype == Self::DTYPE
    }
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    const NAME: &'static str = "f32";
}

impl Element for F16 {
    const DTYPE: Dtype = Dtype::F16;
    const NAME: &'static str = "kvsdk::F16";
}

impl Element for Bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    const NAME: &'static str = "kvsdk::Bf16";
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
}

/// The element type of `dtype`, as error messages name it.
pub(crate) fn element_name(dtype: Dtype) -> String {
    match dtype {
        Dtype::F32 => f32::NAME.to_owned(),
        Dtype::F16 => F16::NAME.to_owned(),
        Dtype::Bf16 => Bf16::NAME.to_owned(),
        Dtype::Unknown(v) => format!("no element type (unknown dtype {v})"),
    }
}

/// "an F16 cache", "a Bf16 cache", ...
pub(crate) fn cache_name(dtype: Dtype) -> String {
    match dtype {
        Dtype::Unknown(v) => format!("a cache of unknown dtype {v}"),
        Dtype::Bf16 => "a Bf16 cache".to_owned(),
        other => format!("an {other:?} cache"),
    }
}

/// `Err(InvalidArg)` unless `T` holds `dtype`; `what` names the buffer ("keys", "queries").
pub(crate) fn require<T: Element>(dtype: Dtype, what: &str) -> crate::Result<()> {
    if T::matches(dtype) {
        return Ok(());
    }
    Err(crate::Error::invalid(format!(
        "{what}: expected {} elements for {}, got {}",
        element_name(dtype),
        cache_name(dtype),
        T::NAME
    )))
}

macro_rules! half_type {
    ($name:ident, $what:literal, $from:ident, $to:ident) => {
        #[doc = concat!("One ", $what, " element: its bit pattern, stored as is (`#[repr(transparent)]` over `u16`).")]
        ///
        /// Equality compares bit patterns (so `+0 != -0`, and a NaN equals itself), which is
        /// what "read back bit-identically" means.
        #[repr(transparent)]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub struct $name(pub u16);

        impl $name {
            /// The element with this bit pattern.
            pub const fn from_bits(bits: u16) -> $name {
                $name(bits)
            }

            /// Its bit pattern.
            pub const fn to_bits(self) -> u16 {
                self.0
            }

            /// `x` rounded to nearest even, exactly like the C library's conversion
            /// (`src/util/half.h`); a NaN becomes a quiet NaN of the same sign.
            pub fn from_f32(x: f32) -> $name {
                $name($from(x.to_bits()))
            }

            /// The exact `f32` value.
            pub fn to_f32(self) -> f32 {
                f32::from_bits($to(self.0))
            }

            /// Bit patterns viewed as elements, without copying.
            pub fn from_bits_slice(bits: &[u16]) -> &[$name] {
                // SAFETY: #[repr(transparent)] over u16: same size, alignment and validity.
                unsafe { std::slice::from_raw_parts(bits.as_ptr().cast::<$name>(), bits.len()) }
            }

            /// Mutable bit patterns viewed as elements (e.g. an output buffer), without copying.
            pub fn from_bits_slice_mut(bits: &mut [u16]) -> &mut [$name] {
                // SAFETY: as from_bits_slice; the borrow is exclusive.
                unsafe {
                    std::slice::from_raw_parts_mut(bits.as_mut_ptr().cast::<$name>(), bits.len())
                }
            }

            /// Elements viewed as their bit patterns, without copying.
            pub fn to_bits_slice(elements: &[$name]) -> &[u16] {
                // SAFETY: #[repr(transparent)] over u16.
                unsafe { std::slice::from_raw_parts(elements.as_ptr().cast::<u16>(), elements.len()) }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#06x} = {:?})", stringify!($name), self.0, self.to_f32())
            }
        }

        impl From<$name> for f32 {
            fn from(x: $name) -> f32 {
                x.to_f32()
            }
        }
    };
}

half_type!(F16, "IEEE 754 binary16 (`Dtype::F16`)", f32_bits_to_f16, f16_bits_to_f32);
half_type!(Bf16, "bfloat16 (`Dtype::Bf16`)", f32_bits_to_bf16, bf16_bits_to_f32);

/// `f32_to_f16` of src/util/half.h on a bit pattern.
fn f32_bits_to_f16(x: u32) -> u16 {
    let sign = (x >> 16) & 0x8000;
    let ax = x & 0x7fff_ffff;
    if ax >= 0x7f80_0000 {
        // Inf or NaN (a NaN stays quiet and non-zero).
        return (sign | 0x7c00 | if ax > 0x7f80_0000 { 0x200 } else { 0 }) as u16;
    }
    if ax >= 0x477f_f000 {
        return (sign | 0x7c00) as u16; // rounds to >= 65520
    }
    if ax < 0x3880_0000 {
        // Below the smallest normal half: adding 0.5 makes the f32 addition's round to
        // nearest even perform the subnormal rounding (as the C code does).
        let r = f32::from_bits(ax) + 0.5f32;
        return (sign | (r.to_bits() - 0x3f00_0000)) as u16;
    }
    let odd = (ax >> 13) & 1;
    let rounded = ax.wrapping_add(0xc800_0fff).wrapping_add(odd);
    (sign | (rounded >> 13)) as u16
}

/// `f16_to_f32` of src/util/half.h, as a bit pattern.
fn f16_bits_to_f32(h: u16) -> u32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1f;
    let man = h & 0x3ff;
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // Subnormal: man * 2^-24, exact in f32.
        return sign | (man as f32 * f32::from_bits(0x3380_0000)).to_bits(); // 2^-24
    }
    if exp == 31 {
        return sign | 0x7f80_0000 | (man << 13);
    }
    sign | ((exp + 112) << 23) | (man << 13)
}

/// `f32_to_bf16` of src/util/half.h on a bit pattern.
fn f32_bits_to_bf16(x: u32) -> u16 {
    if (x & 0x7fff_ffff) > 0x7f80_0000 {
        return ((x >> 16) | 0x40) as u16; // NaN
    }
    (x.wrapping_add(0x7fff).wrapping_add((x >> 16) & 1) >> 16) as u16
}

fn bf16_bits_to_f32(h: u16) -> u32 {
    u32::from(h) << 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_conversions() {
        let cases: [(f32, u16, u16); 12] = [
            (0.0, 0x0000, 0x0000),
            (-0.0, 0x8000, 0x8000),
            (1.0, 0x3c00, 0x3f80),
            (-2.5, 0xc100, 0xc020),
            (0.1, 0x2e66, 0x3dcd),
            (1.0 / 3.0, 0x3555, 0x3eab),
            (65504.0, 0x7bff, 0x4780),
            (65520.0, 0x7c00, 0x4780),
            (6.0e-8, 0x0001, 0x3381),
            (2.0f32.powi(-14), 0x0400, 0x3880),
            (f32::INFINITY, 0x7c00, 0x7f80),
            (f32::NEG_INFINITY, 0xfc00, 0xff80),
        ];
        for (x, f16, bf16) in cases {
            assert_eq!(F16::from_f32(x).to_bits(), f16, "f16 of {x}");
            assert_eq!(Bf16::from_f32(x).to_bits(), bf16, "bf16 of {x}");
        }
        assert_eq!(F16::from_f32(f32::NAN).to_bits(), 0x7e00);
        assert_eq!(F16::from_f32(-f32::NAN).to_bits(), 0xfe00);
        assert_eq!(Bf16::from_f32(f32::NAN).to_bits(), 0x7fc0);
        assert_eq!(Bf16::from_f32(f32::from_bits(0x7f80_0001)).to_bits(), 0x7fc0);
        // Ties go to even: 1 + 2^-11 is halfway between two f16 values.
        assert_eq!(F16::from_f32(1.0 + 2.0f32.powi(-11)).to_bits(), 0x3c00);
        assert_eq!(F16::from_f32(1.0 + 3.0 * 2.0f32.powi(-11)).to_bits(), 0x3c02);
        assert_eq!(Bf16::from_f32(f32::from_bits(0x3f80_8000)).to_bits(), 0x3f80);
        assert_eq!(Bf16::from_f32(f32::from_bits(0x3f81_8000)).to_bits(), 0x3f82);
    }

    #[test]
    fn every_half_converts_exactly_and_back() {
        for bits in 0..=u16::MAX {
            let h = F16(bits);
            let x = h.to_f32();
            if x.is_nan() {
                assert!(F16::from_f32(x).to_f32().is_nan());
            } else {
                assert_eq!(F16::from_f32(x), h, "f16 {bits:#06x}");
            }
            let b = Bf16(bits);
            let y = b.to_f32();
            if !y.is_nan() {
                assert_eq!(Bf16::from_f32(y), b, "bf16 {bits:#06x}");
            }
        }
        assert_eq!(F16(0x0001).to_f32(), 2.0f32.powi(-24));
        assert_eq!(F16(0x7bff).to_f32(), 65504.0);
    }

    #[test]
    fn slices_view_bits_without_copying() {
        let mut bits = [0x3c00u16, 0xc100];
        assert_eq!(F16::from_bits_slice(&bits), &[F16(0x3c00), F16(0xc100)]);
        F16::from_bits_slice_mut(&mut bits)[1] = F16::from_f32(2.0);
        assert_eq!(bits, [0x3c00, 0x4000]);
        assert_eq!(Bf16::to_bits_slice(&[Bf16(7)]), &[7u16]);
        assert_eq!(format!("{:?}", F16(0x3c00)), "F16(0x3c00 = 1.0)");
        assert_eq!(f32::from(Bf16(0x3f80)), 1.0);
    }
}
