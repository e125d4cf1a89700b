//! A tiny, portable, seedable RNG (SplitMix64) with the few distributions the
//! simulator needs. Independent of the engine's RNG so the simulated world and
//! the engine's decisions never share a random stream.

/// SplitMix64: fast, statistically fine for a simulation, identical on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
    spare: Option<f64>,
}

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        Rng {
            state: seed ^ 0x6A09_E667_F3BC_C909,
            spare: None,
        }
    }

    /// A generator derived from this seed and a stream number (arrivals, upstream, ...).
    pub fn stream(seed: u64, stream: u64) -> Self {
        Rng::new(mix(seed ^ mix(stream.wrapping_add(0x1234_5678))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Standard normal (Box–Muller, the second value kept for the next call).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = 1.0 - self.unit(); // (0, 1]
        let u2 = self.unit();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        self.spare = Some(r * s);
        r * c
    }

    /// Log-normal with the given mean and log-space standard deviation `sigma`.
    pub fn lognormal_mean(&mut self, mean: f64, sigma: f64) -> f64 {
        if sigma <= 0.0 {
            return mean;
        }
        mean * (sigma * self.normal() - sigma * sigma / 2.0).exp()
    }
}

/// SplitMix64 finalizer.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_roughly_right() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = Rng::new(1);
        let n = 200_000;
        let (mut e, mut l, mut u) = (0.0, 0.0, 0.0);
        for _ in 0..n {
            e += r.exp(2.0);
            l += r.lognormal_mean(800.0, 0.6);
            u += r.unit();
        }
        let n = n as f64;
        assert!((e / n - 2.0).abs() < 0.03, "exp mean {}", e / n);
        assert!((l / n - 800.0).abs() < 10.0, "lognormal mean {}", l / n);
        assert!((u / n - 0.5).abs() < 0.005);
        for _ in 0..1000 {
            assert!(r.below(3) < 3);
        }
    }
}
