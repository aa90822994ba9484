//! The raw bridge to MLX's C++ API. Private to mlx-core: nothing outside this crate can name a
//! `UniquePtr` or a bridge type. Every function is declared `-> Result`, so a C++ exception
//! becomes a `cxx::Exception` (never an abort); `crate::error` turns it into `Error::Mlx`.

#[cxx::bridge(namespace = "mlxr")]
pub(crate) mod ffi {
    // Shared enums: cxx emits each as a C++ `enum class` of the same discriminants, so the two
    // sides cannot drift apart (shim.cc switches on the names, never on numbers).

    /// MLX element types (`mx::Dtype` in C++, [`crate::Dtype`] in Rust).
    #[repr(i32)]
    enum DtypeCode {
        Bool,
        U8,
        U16,
        U32,
        U64,
        I8,
        I16,
        I32,
        I64,
        F16,
        F32,
        F64,
        Bf16,
        C64,
    }

    /// Elementwise ops of one array.
    #[repr(i32)]
    enum UnaryOp {
        Negative,
        Exp,
        Log,
        Tanh,
        Sigmoid,
        Sqrt,
        Rsqrt,
        Abs,
        Square,
        LogicalNot,
        IsNan,
        Floor,
        Log1p,
        Erf,
        IsInf,
    }

    /// Elementwise ops of two arrays (broadcasting).
    #[repr(i32)]
    enum BinaryOp {
        Add,
        Subtract,
        Multiply,
        Divide,
        Maximum,
        Minimum,
        Power,
        Equal,
        NotEqual,
        Less,
        LessEqual,
        Greater,
        GreaterEqual,
        LogicalAnd,
        LogicalOr,
        FloorDivide,
        Remainder,
    }

    /// Reductions over axes.
    #[repr(i32)]
    enum ReduceOp {
        Sum,
        Max,
        Min,
        Mean,
        LogSumExp,
        Prod,
    }

    /// MLX devices.
    #[repr(i32)]
    enum DeviceKind {
        Cpu,
        Gpu,
    }

    unsafe extern "C++" {
        include!("mlx-core/src/sys/shim.h");

        type Array;
        type ArrayList;

        fn clone_array(a: &Array) -> Result<UniquePtr<Array>>;
        fn shape(a: &Array) -> Result<Vec<i32>>;
        fn dtype(a: &Array) -> Result<DtypeCode>;
        fn nbytes(a: &Array) -> Result<usize>;
        fn sole_holder(a: &Array) -> bool;
        fn buffer_address(a: &Array) -> Result<usize>;
        fn mlx_version() -> Result<String>;
        fn blas_core() -> String;

        fn from_bytes(data: &[u8], shape: &[i32], dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn scalar_f64(v: f64, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn full(shape: &[i32], v: f64, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn arange(start: f64, stop: f64, step: f64, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn to_bytes(a: &Array) -> Result<Vec<u8>>;
        fn eval(l: &ArrayList) -> Result<()>;
        fn async_eval(l: &ArrayList) -> Result<()>;
        fn pending_nodes(l: &ArrayList) -> Result<Vec<String>>;
        fn synchronize() -> Result<()>;

        fn new_list() -> Result<UniquePtr<ArrayList>>;
        fn list_push(l: Pin<&mut ArrayList>, a: &Array) -> Result<()>;
        fn list_len(l: &ArrayList) -> Result<usize>;
        fn list_get(l: &ArrayList, i: usize) -> Result<UniquePtr<Array>>;

        fn unary(op: UnaryOp, a: &Array) -> Result<UniquePtr<Array>>;
        fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn where_(cond: &Array, a: &Array, b: &Array) -> Result<UniquePtr<Array>>;
        fn astype(a: &Array, dtype: DtypeCode) -> Result<UniquePtr<Array>>;
        fn view(a: &Array, dtype: DtypeCode) -> Result<UniquePtr<Array>>;

        fn reshape(a: &Array, shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn transpose(a: &Array, axes: &[i32]) -> Result<UniquePtr<Array>>;
        fn expand_dims(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn squeeze(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn broadcast_to(a: &Array, shape: &[i32]) -> Result<UniquePtr<Array>>;
        fn slice(a: &Array, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<UniquePtr<Array>>;
        fn slice_update(
            src: &Array,
            update: &Array,
            start: &[i32],
            stop: &[i32],
            strides: &[i32],
        ) -> Result<UniquePtr<Array>>;
        fn concatenate(l: &ArrayList, axis: i32) -> Result<UniquePtr<Array>>;
        fn contiguous(a: &Array) -> Result<UniquePtr<Array>>;

        fn take(a: &Array, indices: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn take_along_axis(a: &Array, indices: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn put_along_axis(a: &Array, indices: &Array, values: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn argpartition(a: &Array, kth: i32, axis: i32) -> Result<UniquePtr<Array>>;
        fn sort(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;
        fn argsort(a: &Array, axis: i32) -> Result<UniquePtr<Array>>;

        fn reduce(op: ReduceOp, a: &Array, axes: &[i32], keepdims: bool) -> Result<UniquePtr<Array>>;
        fn argmax(a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;
        fn argmin(a: &Array, axis: i32, keepdims: bool) -> Result<UniquePtr<Array>>;
        fn softmax(a: &Array, axes: &[i32], precise: bool) -> Result<UniquePtr<Array>>;
        fn cumsum(a: &Array, axis: i32, reverse: bool, inclusive: bool) -> Result<UniquePtr<Array>>;

        fn matmul(a: &Array, b: &Array) -> Result<UniquePtr<Array>>;

        fn rms_norm(x: &Array, weight: &ArrayList, eps: f32) -> Result<UniquePtr<Array>>;
        fn rope(
            x: &Array,
            dims: i32,
            traditional: bool,
            base: f32,
            scale: f32,
            offset: &Array,
            freqs: &ArrayList,
        ) -> Result<UniquePtr<Array>>;
        fn sdpa(
            q: &Array,
            k: &Array,
            v: &Array,
            scale: f32,
            mask_mode: &str,
            mask: &ArrayList,
        ) -> Result<UniquePtr<Array>>;

        fn quantize(w: &Array, group_size: i32, bits: i32, mode: &str) -> Result<UniquePtr<ArrayList>>;
        fn dequantize(
            w: &Array,
            scales: &Array,
            biases: &ArrayList,
            group_size: i32,
            bits: i32,
            mode: &str,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn quantized_matmul(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: &ArrayList,
            transpose: bool,
            group_size: i32,
            bits: i32,
            mode: &str,
        ) -> Result<UniquePtr<Array>>;
        #[allow(clippy::too_many_arguments)]
        fn gather_qmm(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: &ArrayList,
            rhs_indices: &Array,
            transpose: bool,
            group_size: i32,
            bits: i32,
            mode: &str,
            sorted_indices: bool,
        ) -> Result<UniquePtr<Array>>;
        fn gather_mm(a: &Array, b: &Array, rhs_indices: &Array, sorted_indices: bool) -> Result<UniquePtr<Array>>;

        fn random_key(seed: u64) -> Result<UniquePtr<Array>>;
        fn random_split(key: &Array, num: i32) -> Result<UniquePtr<ArrayList>>;
        fn random_uniform(
            low: &Array,
            high: &Array,
            shape: &[i32],
            dtype: DtypeCode,
            key: &Array,
        ) -> Result<UniquePtr<Array>>;
        fn random_normal(
            shape: &[i32],
            dtype: DtypeCode,
            loc: f32,
            scale: f32,
            key: &Array,
        ) -> Result<UniquePtr<Array>>;
        fn random_categorical(logits: &Array, axis: i32, key: &Array) -> Result<UniquePtr<Array>>;

        fn load_safetensors(
            path: &str,
            names: &mut Vec<String>,
            metadata: &mut Vec<String>,
        ) -> Result<UniquePtr<ArrayList>>;
        fn save_safetensors(path: &str, names: &[String], arrays: &ArrayList, metadata: &[String]) -> Result<()>;

        fn set_default_device(kind: DeviceKind) -> Result<()>;
        fn default_device() -> Result<DeviceKind>;
        fn device_available(kind: DeviceKind) -> Result<bool>;

        fn new_stream(kind: DeviceKind) -> Result<i32>;
        fn default_stream(kind: DeviceKind) -> Result<i32>;
        fn set_default_stream(index: i32, kind: DeviceKind) -> Result<()>;
        fn synchronize_stream(index: i32, kind: DeviceKind) -> Result<()>;

        fn value_and_grad(ctx: &mut GradCtx<'_>, inputs: &ArrayList, argnums: &[i32]) -> Result<UniquePtr<ArrayList>>;
        fn vjp(ctx: &mut GradCtx<'_>, primals: &ArrayList, cotangents: &ArrayList) -> Result<UniquePtr<ArrayList>>;
        fn stop_gradient(a: &Array) -> Result<UniquePtr<Array>>;

        // ---- row-invariant few-row f32 linear (row_linear.cc) ----
        fn row_linear(x: &Array, w: &Array) -> Result<UniquePtr<Array>>;
        fn row_linear_isa() -> String;
        fn row_gelu(x: &Array) -> Result<UniquePtr<Array>>;
        fn row_softcap(x: &Array, cap: f32) -> Result<UniquePtr<Array>>;
        fn row_log_softmax(x: &Array) -> Result<UniquePtr<Array>>;
        fn row_log_softmax_paths_agree(n: i32) -> bool;
        fn row_linear_paths_agree(m: i32, k: i32, n: i32) -> bool;
        // ---- the same for MLX-affine 8/4-bit weights read packed (row_quantized.cc) ----
        fn row_quantized_linear(
            x: &Array,
            w: &Array,
            scales: &Array,
            biases: &Array,
            group: i32,
            bits: i32,
        ) -> Result<UniquePtr<Array>>;
        fn row_quantized_paths_agree(m: i32, k: i32, n: i32, bits: i32, group: i32) -> bool;
        fn row_quantized_int8_activations(k: i32, bits: i32) -> bool;
        // ---- row-invariant single-query attention (row_attention.cc) ----
        fn row_attention(inputs: &ArrayList, segments: &[i32], scale: f32) -> Result<UniquePtr<Array>>;
        fn row_cache_attention(
            inputs: &ArrayList,
            plan: &[i32],
            writes: bool,
            scale: f32,
        ) -> Result<UniquePtr<ArrayList>>;
        // ---- a dense layer's few-row chains in two nodes (row_layer.cc) ----
        fn row_qkv(
            inputs: &ArrayList,
            packing: &[i32],
            head_dim: i32,
            batch: i32,
            eps: f32,
        ) -> Result<UniquePtr<ArrayList>>;
        fn row_ffn(inputs: &ArrayList, packing: &[i32], ple: bool, eps: f32) -> Result<UniquePtr<Array>>;
        fn row_rms_norm(inputs: &ArrayList, eps: f32) -> Result<UniquePtr<Array>>;
        fn row_normed_heads(
            inputs: &ArrayList,
            packing: &[i32],
            head_dim: i32,
            batch: i32,
            eps: f32,
        ) -> Result<UniquePtr<ArrayList>>;
        fn row_prenorm_ffn(inputs: &ArrayList, packing: &[i32], eps: f32) -> Result<UniquePtr<Array>>;
        // ---- a drafter's greedy Markov walk in one node (row_markov.cc) ----
        fn row_markov_greedy(
            u: &Array,
            w1: &Array,
            w2: &Array,
            anchors: &Array,
            ns: &[i32],
        ) -> Result<UniquePtr<ArrayList>>;
        // ---- sampling rows in one node (row_sample.cc) ----
        fn row_probs(
            logits: &Array,
            inv_t: f32,
            top_p: f64,
            min_p: f64,
            min_keep: i32,
            top_k: i32,
        ) -> Result<UniquePtr<Array>>;
        fn row_draw(weights: &Array, u: &Array, residual_of: &ArrayList, empty_mass: f32) -> Result<UniquePtr<Array>>;
        // ---- a logistic head over rows and their laws in one node (row_confidence.cc) ----
        fn row_confidence(parts: &ArrayList, w: &Array, b: &Array, law_of: &ArrayList) -> Result<UniquePtr<Array>>;
    }

    extern "Rust" {
        type GradCtx<'a>;
        fn grad_trampoline(ctx: &mut GradCtx<'_>, inputs: &ArrayList, out: Pin<&mut ArrayList>) -> Result<()>;
    }
}

use crate::autodiff::{grad_trampoline, GradCtx};

// SAFETY: an MLX array is an immutable, atomically refcounted handle; moving the owning
// pointer to another thread is sound. It is not `Sync`: concurrent `eval` of one graph from
// two threads is not something MLX promises to support.
unsafe impl Send for ffi::Array {}
// SAFETY: as above; the list only holds array handles.
unsafe impl Send for ffi::ArrayList {}
