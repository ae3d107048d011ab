//! The timeout argument of blocking commands (BLPOP, BRPOP, BRPOPLPUSH,
//! BLMOVE, BLMPOP, BZPOPMIN, ...), judged exactly as Redis 7.0 does.
//!
//! Redis reads it with C's `strtold` into an x87 80-bit `long double`
//! (64-bit significand), multiplies by 1000 in that precision, rounds up with
//! `ceill` and converts to `long long`. Hex floats, exponents far outside
//! `f64`'s range and the rounding of values like `0.001` all follow from that,
//! so this module emulates the format exactly instead of going through `f64`:
//! decimal input is converted with arbitrary precision and rounded once, as
//! glibc's `strtold` does.

use std::cmp::Ordering;
use std::fmt;

/// A valid timeout: block forever, or for this many milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    Forever,
    /// Always in `1..=i64::MAX`.
    Millis(u64),
}

/// Why Redis refuses a timeout; [`fmt::Display`] gives its error text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutError {
    /// Not a number `strtold` takes whole, NaN, or past the range of a
    /// `long double` (overflow to infinity or underflow to zero).
    NotAFloat,
    /// Negative after rounding up to milliseconds. Redis 7.0 also says this
    /// for infinities and for anything of 2^63 ms or more: its conversion to
    /// `long long` yields `LLONG_MIN` there (x86-64).
    Negative,
}

impl TimeoutError {
    /// The reply's text, without the `ERR ` prefix.
    pub fn message(self) -> &'static str {
        match self {
            TimeoutError::NotAFloat => "timeout is not a float or out of range",
            TimeoutError::Negative => "timeout is negative",
        }
    }
}

impl fmt::Display for TimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for TimeoutError {}

/// Redis's `MAX_LONG_DOUBLE_CHARS`: arguments this long or longer are refused
/// before parsing.
const MAX_CHARS: usize = 5 * 1024;

/// Parses a timeout in seconds as Redis 7.0's `getTimeoutFromObjectOrReply`.
/// A valid positive timeout is the milliseconds Redis adds to the current
/// time (which may itself overflow in Redis for values near `i64::MAX`).
pub fn parse_timeout_secs(arg: &[u8]) -> Result<Timeout, TimeoutError> {
    whole_seconds(arg).map_or_else(|| parse_exactly(arg), Ok)
}

/// Digits that do not overflow when counted in ms.
const WHOLE_DIGITS: usize = 15;

/// Whole seconds, what nearly every blocking pop gives: an integer below
/// 10^15 is exact in a long double, and so is its product by 1000, so
/// there is no rounding to reproduce (which costs [`parse_exactly`] tens of
/// thousands of instructions and a hundred allocations).
fn whole_seconds(arg: &[u8]) -> Option<Timeout> {
    if arg.is_empty() || arg.len() > WHOLE_DIGITS || !arg.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let secs = arg.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match secs {
        0 => Timeout::Forever,
        s => Timeout::Millis(s * 1000),
    })
}

/// [`parse_timeout_secs`] for any argument, through an emulation of the
/// 80-bit long double Redis parses into.
fn parse_exactly(arg: &[u8]) -> Result<Timeout, TimeoutError> {
    let x = parse_long_double(arg).ok_or(TimeoutError::NotAFloat)?;
    let (neg, millis) = match x {
        Ld::Zero { .. } => return Ok(Timeout::Forever),
        Ld::Inf { .. } => return Err(TimeoutError::Negative),
        Ld::Finite { neg, m, e } => {
            let product = round_to_ld(Big::from_u128(m as u128 * 1000), &Big::one(), e as i64);
            match product {
                Ld::Finite { m, e, .. } => (neg, (m, e)),
                Ld::Inf { .. } => return Err(TimeoutError::Negative),
                Ld::Zero { .. } => unreachable!("a nonzero value times 1000 is not zero"),
            }
        }
    };
    let (m, e) = millis;
    // floor(|y|) and whether |y| has a fractional part; None when |y| >= 2^63.
    let (int, frac) = if e >= 0 {
        if 64 - m.leading_zeros() as i32 + e > 63 {
            return Err(TimeoutError::Negative);
        }
        (m << e, false)
    } else if -e >= 64 {
        (0, true)
    } else {
        let shift = -e as u32;
        (m >> shift, m & ((1u64 << shift) - 1) != 0)
    };
    if neg {
        // ceil of a negative number is minus the floor of its magnitude: -0
        // (block forever) for anything above -1 ms.
        return if int == 0 {
            Ok(Timeout::Forever)
        } else {
            Err(TimeoutError::Negative)
        };
    }
    let ceil = int + frac as u64;
    if ceil > i64::MAX as u64 {
        return Err(TimeoutError::Negative);
    }
    Ok(Timeout::Millis(ceil))
}

/// An x87 extended-precision value: `m * 2^e`, `m` nonzero with at most 64
/// bits (fewer only for subnormals, which have `e == MIN_EXP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ld {
    Zero { neg: bool },
    Inf { neg: bool },
    Finite { neg: bool, m: u64, e: i32 },
}

/// Exponent of the least significant bit of the smallest subnormal.
const MIN_EXP: i64 = -16445;
/// Exponent of the most significant bit of the largest finite value.
const MAX_TOP_EXP: i64 = 16383;

/// Redis's `string2ld`: the whole argument must be one number as `strtold`
/// reads it in the C locale, not starting with whitespace, not NaN, and not
/// overflowing or underflowing to zero. `None` when Redis refuses it.
fn parse_long_double(s: &[u8]) -> Option<Ld> {
    if s.is_empty() || s.len() >= MAX_CHARS || is_c_space(s[0]) {
        return None;
    }
    let (neg, rest) = match s[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower: Vec<u8> = rest.iter().take(8).map(u8::to_ascii_lowercase).collect();
    if lower.starts_with(b"inf") {
        // strtold takes "inf" or "infinity"; anything else after "inf" is
        // left over, which Redis refuses.
        return (rest.len() == 3 || (rest.len() == 8 && lower == b"infinity"))
            .then_some(Ld::Inf { neg });
    }
    if lower.starts_with(b"nan") {
        return None;
    }
    let value = if lower.starts_with(b"0x") && hex_mantissa_follows(&rest[2..]) {
        parse_hex(&rest[2..])?
    } else {
        parse_decimal(rest)?
    };
    match value {
        Parsed::Zero => Some(Ld::Zero { neg }),
        Parsed::Value(num, den, e2) => match round_to_ld(num, &den, e2) {
            // Overflow and underflow to zero set ERANGE, which Redis refuses.
            Ld::Finite { m, e, .. } => Some(Ld::Finite { neg, m, e }),
            Ld::Inf { .. } | Ld::Zero { .. } => None,
        },
        Parsed::Overflow | Parsed::Underflow => None,
    }
}

fn is_c_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// strtold reads "0x" as a hex prefix only if a hex digit follows, possibly
/// after the point; otherwise it reads just the "0".
fn hex_mantissa_follows(s: &[u8]) -> bool {
    match s {
        [c, ..] if c.is_ascii_hexdigit() => true,
        [b'.', c, ..] => c.is_ascii_hexdigit(),
        _ => false,
    }
}

/// A parsed nonzero value `num / den * 2^e2`, or a verdict already known
/// from its magnitude.
enum Parsed {
    Zero,
    Value(Big, Big, i64),
    Overflow,
    Underflow,
}

/// Exponents beyond this make no difference (the value is out of range
/// either way) and are clamped so the arithmetic cannot overflow.
const EXP_CLAMP: i64 = 1 << 40;

/// Parses `[+-]digits` to the end of `s`; `None` if it is not exactly that.
fn parse_exponent(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v = digits
        .iter()
        .fold(0i64, |v, &d| (v * 10 + (d - b'0') as i64).min(EXP_CLAMP));
    Some(if neg { -v } else { v })
}

/// Splits `digits[.digits]` off the front of `s` with `is_digit`; returns
/// the integer and fraction digits and what follows, or `None` if there is
/// no digit at all.
fn split_mantissa(s: &[u8], is_digit: fn(&u8) -> bool) -> Option<(&[u8], &[u8], &[u8])> {
    let int_len = s.iter().take_while(|c| is_digit(c)).count();
    let (int, rest) = s.split_at(int_len);
    let (frac, rest) = match rest.first() {
        Some(b'.') => {
            let n = rest[1..].iter().take_while(|c| is_digit(c)).count();
            (&rest[1..1 + n], &rest[1 + n..])
        }
        _ => (&rest[..0], rest),
    };
    (!int.is_empty() || !frac.is_empty()).then_some((int, frac, rest))
}

fn parse_decimal(s: &[u8]) -> Option<Parsed> {
    let (int, frac, rest) = split_mantissa(s, u8::is_ascii_digit)?;
    let exp = match rest {
        [] => 0,
        [b'e' | b'E', e @ ..] => parse_exponent(e)?,
        _ => return None,
    };
    let digits: Vec<u8> = int.iter().chain(frac).copied().collect();
    let first = match digits.iter().position(|&d| d != b'0') {
        Some(i) => i,
        None => return Some(Parsed::Zero),
    };
    let last = digits.iter().rposition(|&d| d != b'0').unwrap();
    let significant = &digits[first..=last];
    // The value is significant * 10^e10, with 10^(n-1) <= significant < 10^n.
    let e10 = exp - frac.len() as i64 + (digits.len() - 1 - last) as i64;
    let n = significant.len() as i64;
    // The largest long double is about 1.19e4932 and half the smallest
    // subnormal about 1.8e-4951; the margins leave the close calls to the
    // exact arithmetic below.
    if n - 1 + e10 > 4940 {
        return Some(Parsed::Overflow);
    }
    if n + e10 < -4960 {
        return Some(Parsed::Underflow);
    }
    let mut num = Big::zero();
    for chunk in significant.chunks(9) {
        let v = chunk.iter().fold(0u32, |v, &d| v * 10 + (d - b'0') as u32);
        num.mul_add_small(10u32.pow(chunk.len() as u32), v);
    }
    let mut den = Big::one();
    if e10 >= 0 {
        num.mul_pow10(e10 as u32);
    } else {
        den.mul_pow10((-e10) as u32);
    }
    Some(Parsed::Value(num, den, 0))
}

fn parse_hex(s: &[u8]) -> Option<Parsed> {
    let (int, frac, rest) = split_mantissa(s, u8::is_ascii_hexdigit)?;
    let exp = match rest {
        [] => 0,
        [b'p' | b'P', e @ ..] => parse_exponent(e)?,
        _ => return None,
    };
    let mut num = Big::zero();
    for &d in int.iter().chain(frac) {
        num.mul_add_small(16, (d as char).to_digit(16).unwrap());
    }
    if num.is_zero() {
        return Some(Parsed::Zero);
    }
    let e2 = exp - 4 * frac.len() as i64;
    let top = num.bit_len() as i64 - 1 + e2;
    if top > MAX_TOP_EXP + 1 {
        return Some(Parsed::Overflow);
    }
    if top < MIN_EXP - 2 {
        return Some(Parsed::Underflow);
    }
    Some(Parsed::Value(num, Big::one(), e2))
}

/// Rounds the positive value `num / den * 2^e2` to the nearest long double,
/// ties to even, with the format's subnormals, overflow to infinity and
/// underflow to zero.
fn round_to_ld(num: Big, den: &Big, e2: i64) -> Ld {
    // floor(log2(num / den)): the bit lengths give it to within one.
    let guess = num.bit_len() as i64 - den.bit_len() as i64;
    let at_least_guess = if guess >= 0 {
        num.cmp(&den.shl(guess as usize)) != Ordering::Less
    } else {
        num.shl((-guess) as usize).cmp(den) != Ordering::Less
    };
    let top = guess - i64::from(!at_least_guess) + e2;
    if top > MAX_TOP_EXP {
        return Ld::Inf { neg: false };
    }
    // Exponent of the result's last significand bit, and two more bits below
    // it to round with.
    let lsb = (top - 63).max(MIN_EXP);
    let shift = e2 - (lsb - 2);
    let (mut num, den) = if shift >= 0 {
        (num.shl(shift as usize), den.clone())
    } else {
        (num, den.shl((-shift) as usize))
    };
    let q = num.div_small_quotient(&den, 66);
    let sticky = !num.is_zero();
    let mut m = q >> 2;
    let half = q & 2 != 0;
    let past_half = q & 1 != 0 || sticky;
    if half && (past_half || m & 1 == 1) {
        m += 1;
    }
    let mut lsb = lsb;
    if m == 1 << 64 {
        m = 1 << 63;
        lsb += 1;
    }
    if m == 0 {
        return Ld::Zero { neg: false };
    }
    if lsb + 63 > MAX_TOP_EXP {
        return Ld::Inf { neg: false };
    }
    Ld::Finite {
        neg: false,
        m: m as u64,
        e: lsb as i32,
    }
}

/// A minimal unsigned big integer: little-endian 32-bit limbs, no trailing
/// zero limbs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Big(Vec<u32>);

impl Big {
    fn zero() -> Big {
        Big(Vec::new())
    }

    fn one() -> Big {
        Big(vec![1])
    }

    fn from_u128(mut v: u128) -> Big {
        let mut limbs = Vec::new();
        while v != 0 {
            limbs.push(v as u32);
            v >>= 32;
        }
        Big(limbs)
    }

    fn is_zero(&self) -> bool {
        self.0.is_empty()
    }

    fn bit_len(&self) -> usize {
        match self.0.last() {
            None => 0,
            Some(&top) => 32 * self.0.len() - top.leading_zeros() as usize,
        }
    }

    /// self = self * mul + add
    fn mul_add_small(&mut self, mul: u32, add: u32) {
        let mut carry = add as u64;
        for limb in &mut self.0 {
            let v = *limb as u64 * mul as u64 + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry != 0 {
            self.0.push(carry as u32);
        }
    }

    fn mul_pow10(&mut self, mut n: u32) {
        while n >= 9 {
            self.mul_add_small(1_000_000_000, 0);
            n -= 9;
        }
        self.mul_add_small(10u32.pow(n), 0);
    }

    fn shl(&self, bits: usize) -> Big {
        if self.is_zero() {
            return Big::zero();
        }
        let (limbs, bits) = (bits / 32, bits % 32);
        let mut out = vec![0u32; limbs];
        out.reserve(self.0.len() + 1);
        let mut carry = 0u32;
        for &limb in &self.0 {
            if bits == 0 {
                out.push(limb);
            } else {
                out.push(limb << bits | carry);
                carry = limb >> (32 - bits);
            }
        }
        if carry != 0 {
            out.push(carry);
        }
        Big(out)
    }

    fn cmp(&self, other: &Big) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }

    /// self -= other; `other` must not exceed `self`.
    fn sub_assign(&mut self, other: &Big) {
        let mut borrow = 0i64;
        for (i, limb) in self.0.iter_mut().enumerate() {
            let v = *limb as i64 - other.0.get(i).copied().unwrap_or(0) as i64 - borrow;
            *limb = v.rem_euclid(1 << 32) as u32;
            borrow = i64::from(v < 0);
        }
        debug_assert_eq!(borrow, 0);
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    /// Divides self by `den` when the quotient is known to be below
    /// 2^`bits`: returns the quotient and leaves the remainder in self.
    fn div_small_quotient(&mut self, den: &Big, bits: u32) -> u128 {
        let mut q = 0u128;
        for j in (0..bits as usize).rev() {
            let d = den.shl(j);
            if self.cmp(&d) != Ordering::Less {
                self.sub_assign(&d);
                q |= 1 << j;
            }
        }
        debug_assert!(self.cmp(den) == Ordering::Less);
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Result<Timeout, TimeoutError> {
        parse_timeout_secs(s.as_bytes())
    }

    fn ld(s: &str) -> Option<Ld> {
        parse_long_double(s.as_bytes())
    }

    #[test]
    fn whole_seconds_read_as_the_long_double_emulation_reads_them() {
        let mut cases: Vec<String> = [
            "0",
            "00",
            "1",
            "007",
            "5",
            "86400",
            "999999999999999",
            "000000000000001",
            "9223372036854775",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let digits = 1 + (x % WHOLE_DIGITS as u64) as u32;
            cases.push((x % 10u64.pow(digits)).to_string());
        }
        for c in &cases {
            let exact = parse_exactly(c.as_bytes());
            assert_eq!(t(c), exact, "{c}");
            if c.len() <= WHOLE_DIGITS {
                assert_eq!(whole_seconds(c.as_bytes()).map(Ok), Some(exact), "{c}");
            } else {
                assert_eq!(whole_seconds(c.as_bytes()), None, "{c}");
            }
        }
        for other in [
            "",
            "1.5",
            "-1",
            "+1",
            " 1",
            "1e3",
            "0x10",
            "1000000000000000",
        ] {
            assert_eq!(whole_seconds(other.as_bytes()), None, "{other:?}");
            assert_eq!(t(other), parse_exactly(other.as_bytes()), "{other:?}");
        }
    }

    #[test]
    fn rounds_like_an_80_bit_long_double() {
        assert_eq!(
            ld("1"),
            Some(Ld::Finite {
                neg: false,
                m: 1 << 63,
                e: -63
            })
        );
        assert_eq!(ld("-0"), Some(Ld::Zero { neg: true }));
        // 0.1 is 0xCCCCCCCCCCCCCCCD * 2^-67 in 64 bits, rounded up.
        assert_eq!(
            ld("0.1"),
            Some(Ld::Finite {
                neg: false,
                m: 0xCCCC_CCCC_CCCC_CCCD,
                e: -67
            })
        );
        // Halfway between 2^64 - 1 and 2^64 (as a 65-bit pattern) rounds to
        // even, carrying into the next binade.
        assert_eq!(
            ld("36893488147419103231"),
            Some(Ld::Finite {
                neg: false,
                m: 1 << 63,
                e: 2
            })
        );
        // The smallest subnormal, and half of it rounding to zero (refused).
        assert_eq!(
            ld("0x1p-16445"),
            Some(Ld::Finite {
                neg: false,
                m: 1,
                e: -16445
            })
        );
        assert_eq!(ld("0x1p-16446"), None);
        assert_eq!(
            ld("0x1.8p-16446"),
            Some(Ld::Finite {
                neg: false,
                m: 1,
                e: -16445
            })
        );
        assert!(matches!(ld("0x1p16383"), Some(Ld::Finite { .. })));
        assert_eq!(ld("0x1p16384"), None);
    }

    #[test]
    fn verdicts() {
        use Timeout::*;
        use TimeoutError::*;
        assert_eq!(t("0"), Ok(Forever));
        assert_eq!(t("-0.0001"), Ok(Forever));
        assert_eq!(t("1.5"), Ok(Millis(1500)));
        assert_eq!(t("0x1p-2"), Ok(Millis(250)));
        assert_eq!(t("1e-400"), Ok(Millis(1)));
        assert_eq!(t("1e-5000"), Err(NotAFloat));
        assert_eq!(t("1e5000"), Err(NotAFloat));
        assert_eq!(t("inf"), Err(Negative));
        assert_eq!(t("nan"), Err(NotAFloat));
        assert_eq!(t(" 1"), Err(NotAFloat));
        assert_eq!(t("1 "), Err(NotAFloat));
        assert_eq!(t("0x"), Err(NotAFloat));
        assert_eq!(t("9.3e15"), Err(Negative));
        assert_eq!(t("-1"), Err(Negative));
        assert_eq!(parse_timeout_secs(b"1\0"), Err(NotAFloat));
        assert_eq!(parse_timeout_secs(&[b'0'; 5119]), Ok(Forever));
        assert_eq!(parse_timeout_secs(&[b'0'; 5120]), Err(NotAFloat));
        assert_eq!(
            NotAFloat.to_string(),
            "timeout is not a float or out of range"
        );
    }
}
