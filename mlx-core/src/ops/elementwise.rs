//! Elementwise arithmetic. Scalar variants build the scalar **in the array's dtype** (MLX's weak
//! scalar rule): `bf16 * 39.19` multiplies by bf16(39.19) = 39.25 and stays bf16. See
//! docs/numerics.md, "Weak scalars".

use crate::array::Array;
use crate::error::Result;
use crate::sys::ffi;
use crate::Dtype;

use ffi::{BinaryOp, UnaryOp};

macro_rules! unary {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Array {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $name(&self) -> Result<Array> {
                    Array::wrap(stringify!($name), ffi::unary(UnaryOp::$op, self.raw()))
                }
            )*
        }
    };
}

macro_rules! binary {
    ($($(#[$m:meta])* $name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Array {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $name(&self, other: &Array) -> Result<Array> {
                    Array::wrap(stringify!($name), ffi::binary(BinaryOp::$op, self.raw(), other.raw()))
                }

                /// The same op against a scalar of this array's dtype (weak scalar).
                #[track_caller]
                pub fn $scalar(&self, v: f64) -> Result<Array> {
                    let s = Array::scalar(v, self.dtype())?;
                    self.$name(&s)
                }
            )*
        }
    };
}

unary! {
    /// -x
    negative => Negative,
    /// e^x
    exp => Exp,
    /// ln x
    log => Log,
    /// tanh x
    tanh => Tanh,
    /// 1 / (1 + e^-x)
    sigmoid => Sigmoid,
    /// √x
    sqrt => Sqrt,
    /// 1/√x
    rsqrt => Rsqrt,
    /// |x|
    abs => Abs,
    /// x²
    square => Square,
    /// !x
    logical_not => LogicalNot,
    /// x is NaN
    isnan => IsNan,
    /// x is ±inf
    isinf => IsInf,
    /// ⌊x⌋
    floor => Floor,
    /// ln(1 + x)
    log1p => Log1p,
    /// erf x
    erf => Erf,
}

binary! {
    /// a + b (broadcasting)
    add, add_scalar => Add,
    /// a − b
    subtract, sub_scalar => Subtract,
    /// a · b
    multiply, mul_scalar => Multiply,
    /// a / b
    divide, div_scalar => Divide,
    /// max(a, b)
    maximum, maximum_scalar => Maximum,
    /// min(a, b)
    minimum, minimum_scalar => Minimum,
    /// a^b
    power, power_scalar => Power,
    /// a == b
    equal, equal_scalar => Equal,
    /// a != b
    not_equal, not_equal_scalar => NotEqual,
    /// a < b
    less, less_scalar => Less,
    /// a <= b
    less_equal, less_equal_scalar => LessEqual,
    /// a > b
    greater, greater_scalar => Greater,
    /// a >= b
    greater_equal, greater_equal_scalar => GreaterEqual,
    /// a && b
    logical_and, logical_and_scalar => LogicalAnd,
    /// a || b
    logical_or, logical_or_scalar => LogicalOr,
    /// ⌊a / b⌋
    floor_divide, floor_divide_scalar => FloorDivide,
    /// a mod b
    remainder, remainder_scalar => Remainder,
}

impl Array {
    /// `v − self` with `v` a weak scalar.
    #[track_caller]
    pub fn rsub_scalar(&self, v: f64) -> Result<Array> {
        Array::scalar(v, self.dtype())?.subtract(self)
    }

    /// Converts to `dtype`.
    #[track_caller]
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        Array::wrap("astype", ffi::astype(self.raw(), dtype.code()))
    }

    /// Reinterprets the bytes as `dtype` (last axis rescaled by the size ratio).
    #[track_caller]
    pub fn view(&self, dtype: Dtype) -> Result<Array> {
        Array::wrap("view", ffi::view(self.raw(), dtype.code()))
    }
}

/// `cond ? a : b`, elementwise with broadcasting.
#[track_caller]
pub fn where_(cond: &Array, a: &Array, b: &Array) -> Result<Array> {
    Array::wrap("where", ffi::where_(cond.raw(), a.raw(), b.raw()))
}

/// MLX's `nn.gelu_approx`, op for op: `0.5 * x * (1 + tanh(sqrt(2/π) * (x + 0.044715 * x**3)))`
/// with weak scalars and `x**3` as `power`: `x*x*x` gives other bf16 bits (docs/numerics.md,
/// "Activation: `x**3` is `power`").
#[track_caller]
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let cube = x.power_scalar(3.0)?;
    let inner = x.add(&cube.mul_scalar(0.044715)?)?;
    let t = inner.mul_scalar((2.0 / std::f64::consts::PI).sqrt())?.tanh()?;
    x.mul_scalar(0.5)?.multiply(&t.add_scalar(1.0)?)
}
