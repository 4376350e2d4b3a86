//! Choosing a free slot in a range (no IO): dynamic allocation prefers the upper band and falls
//! back to the static band at the bottom of the range, as upstream's allocators do.

use rand::Rng;

/// Picks a free index in `0..size`: a random start in the dynamic band `band..size`, scanning
/// upward (wrapping inside the band) for at most `max_scan` slots; then the same in the static
/// band `0..band`. `taken` says whether an index is in use.
pub fn pick_free(
    size: u128,
    band: u128,
    max_scan: u128,
    taken: impl Fn(u128) -> bool,
    rng: &mut impl Rng,
) -> Option<u128> {
    let band = band.min(size);
    let scan = |lo: u128, hi: u128, rng: &mut dyn rand::RngCore| -> Option<u128> {
        let len = hi.checked_sub(lo).filter(|l| *l > 0)?;
        let start = rng.random_range(0..len);
        (0..len.min(max_scan)).find_map(|k| {
            let i = lo + (start + k) % len;
            (!taken(i)).then_some(i)
        })
    };
    scan(band, size, rng).or_else(|| scan(0, band, rng))
}

/// A random index in the dynamic band (or anywhere when the band covers everything).
pub fn random_dynamic(size: u128, band: u128, rng: &mut impl Rng) -> Option<u128> {
    if size == 0 {
        return None;
    }
    if band >= size {
        return Some(rng.random_range(0..size));
    }
    Some(rng.random_range(band..size))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn prefers_upper_band_then_static() {
        let mut rng = rand::rng();
        // 100 slots, band 16: the first 84 picks land in 16..100, then 0..16, then none.
        let mut used = HashSet::new();
        for n in 0..100 {
            let i = pick_free(100, 16, u128::MAX, |i| used.contains(&i), &mut rng).unwrap();
            assert!(used.insert(i));
            if n < 84 {
                assert!(i >= 16, "pick {n} = {i}");
            } else {
                assert!(i < 16, "pick {n} = {i}");
            }
        }
        assert_eq!(
            pick_free(100, 16, u128::MAX, |i| used.contains(&i), &mut rng),
            None
        );
    }

    #[test]
    fn table() {
        let mut rng = rand::rng();
        let cases: &[(u128, u128, &[u128], Option<u128>)] = &[
            (0, 0, &[], None),
            (1, 0, &[], Some(0)),
            (1, 0, &[0], None),
            (4, 16, &[0, 1, 3], Some(2)),
            (20, 16, &[16, 17, 18, 19], None),
        ];
        for (size, band, used, want) in cases {
            let got = pick_free(*size, *band, u128::MAX, |i| used.contains(&i), &mut rng);
            match want {
                Some(w) => assert_eq!(got, Some(*w)),
                None if *size == 20 => assert!(got.is_some_and(|g| g < 16)),
                None => assert_eq!(got, None),
            }
        }
    }

    #[test]
    fn random_dynamic_in_band() {
        let mut rng = rand::rng();
        for _ in 0..1000 {
            let i = random_dynamic(100, 16, &mut rng).unwrap();
            assert!((16..100).contains(&i));
            assert!(random_dynamic(10, 16, &mut rng).unwrap() < 10);
        }
        assert_eq!(random_dynamic(0, 0, &mut rng), None);
    }
}
