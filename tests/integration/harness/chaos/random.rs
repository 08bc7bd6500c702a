//! The seeded random source of a chaos run: a generator, the seed it was
//! drawn from (printed, and printed again on failure, so a mix replays) and
//! numbers read from the environment.

/// A seeded generator (fastrand's wyrand): the same seed, the same mix.
pub struct Rng(fastrand::Rng);

impl Rng {
    /// A generator replaying `seed`.
    pub fn new(seed: u64) -> Self {
        Self(fastrand::Rng::with_seed(seed))
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.0.u64(lo..=hi)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Any number (a seed for another generator).
    pub fn next(&mut self) -> u64 {
        self.0.u64(..)
    }

    /// An index into a slice of `len` items.
    pub fn index(&mut self, len: usize) -> usize {
        self.0.usize(..len)
    }

    /// Shuffles `items` in place.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        self.0.shuffle(items);
    }
}

/// The seed of one run: from `var` when set (a replay), else from the
/// clock. Printed when drawn, and again if the test fails, with the way to
/// replay it; timing is not replayed, the mix is.
pub struct Seed {
    pub value: u64,
    var: &'static str,
}

impl Seed {
    /// The seed of the run `what`, from `var` or the clock.
    pub fn from_env(what: &str, var: &'static str) -> Self {
        let value = env_u64(var).unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            nanos ^ u64::from(std::process::id()).rotate_left(32)
        });
        eprintln!("{what}: seed {value} (replay the mix with {var}={value})");
        Self { value, var }
    }

    /// The generator of stream `n` (one per worker, fault thread...).
    pub fn rng(&self, n: u64) -> Rng {
        Rng::new(self.value ^ (n + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "FAILED with seed {0}: replay with {1}={0}",
                self.value, self.var
            );
        }
    }
}

/// A whole number from the environment (`None`: unset or empty).
#[track_caller]
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().filter(|s| !s.is_empty()).map(|s| {
        s.parse()
            .unwrap_or_else(|_| panic!("{name}={s:?}: give a whole number"))
    })
}
