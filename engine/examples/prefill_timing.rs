use gemma4::{ComputeDtype, Model};
use std::time::Instant;
fn main() {
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| engine::default_model::ensure(false).unwrap());
    let (m, _) = Model::load_as(&dir, ComputeDtype::Auto, mlx_core::Device::Cpu).unwrap();
    for n in [1usize, 16, 32, 64, 128, 256, 512] {
        let ids: Vec<u32> = (0..n as u32).map(|i| 4 + i * 7 % 4000).collect();
        let mut best = f64::MAX;
        for _ in 0..3 {
            let mut c = m.new_cache();
            let pre: Vec<u32> = (0..100u32).map(|i| 5 + i % 300).collect();
            m.forward(&gemma4::generate::ids_array(&pre).unwrap(), Some(&mut c)).unwrap();
            c.eval().unwrap();
            let t = Instant::now();
            let h = m.forward(&gemma4::generate::ids_array(&ids).unwrap(), Some(&mut c)).unwrap();
            h.eval().unwrap();
            c.eval().unwrap();
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
        println!("{n} tokens: {best:.1} ms");
    }
}
