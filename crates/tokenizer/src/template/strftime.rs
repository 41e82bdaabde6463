//! `strftime_now(format)`: HF templates call it to print today's date (Llama 3.x writes
//! "Today Date: 26 Jul 2024"). HF formats `datetime.now()`, a naive local time; minfer has no
//! time-zone database, so it formats UTC (`%z`/`%Z` print nothing, as for a naive datetime).
//! Directives follow C-locale glibc `strftime`.

use std::fmt::Write;

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A broken-down UTC time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CivilTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub micros: u32,
    /// 0 = Monday .. 6 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub yday: u32,
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

impl CivilTime {
    /// The UTC time `secs` seconds (and `micros`) after 1970-01-01T00:00:00.
    pub fn from_unix(secs: i64, micros: u32) -> CivilTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        // Civil date from a day count, by 400-year eras starting on March 1st (so the leap
        // day is the last day of the era-relative year).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097); // [0, 146096]
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365], from March 1st
        let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = CUM[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
        // 1970-01-01 was a Thursday (3 when Monday is 0).
        let weekday = (days + 3).rem_euclid(7) as u32;
        CivilTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            micros,
            weekday,
            yday,
        }
    }

    /// Now, from the system clock.
    pub fn now() -> CivilTime {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        CivilTime::from_unix(d.as_secs() as i64, d.subsec_micros())
    }

    /// C `strftime`. An unknown directive is an error naming it.
    pub fn format(&self, fmt: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            // glibc flag: `%-d` drops the padding.
            let mut d = chars.next();
            let no_pad = d == Some('-');
            if no_pad {
                d = chars.next();
            }
            let num = |out: &mut String, v: i64, width: usize| {
                if no_pad {
                    let _ = write!(out, "{v}");
                } else {
                    let _ = write!(out, "{v:0width$}");
                }
            };
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            match d {
                Some('a') => out.push_str(&DAYS[self.weekday as usize][..3]),
                Some('A') => out.push_str(DAYS[self.weekday as usize]),
                Some('w') => num(&mut out, i64::from((self.weekday + 1) % 7), 1),
                Some('u') => num(&mut out, i64::from(self.weekday + 1), 1),
                Some('d') => num(&mut out, i64::from(self.day), 2),
                Some('e') => {
                    if no_pad {
                        num(&mut out, i64::from(self.day), 1)
                    } else {
                        let _ = write!(out, "{:>2}", self.day);
                    }
                }
                Some('b') | Some('h') => out.push_str(&MONTHS[self.month as usize - 1][..3]),
                Some('B') => out.push_str(MONTHS[self.month as usize - 1]),
                Some('m') => num(&mut out, i64::from(self.month), 2),
                Some('y') => num(&mut out, self.year.rem_euclid(100), 2),
                Some('Y') => {
                    let _ = write!(out, "{}", self.year);
                }
                Some('H') => num(&mut out, i64::from(self.hour), 2),
                Some('I') => num(&mut out, i64::from(hour12), 2),
                Some('p') => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                Some('M') => num(&mut out, i64::from(self.minute), 2),
                Some('S') => num(&mut out, i64::from(self.second), 2),
                Some('f') => num(&mut out, i64::from(self.micros), 6),
                Some('j') => num(&mut out, i64::from(self.yday), 3),
                Some('z') | Some('Z') => {}
                Some('F') => out.push_str(&self.format("%Y-%m-%d")?),
                Some('D') | Some('x') => out.push_str(&self.format("%m/%d/%y")?),
                Some('T') | Some('X') => out.push_str(&self.format("%H:%M:%S")?),
                Some('R') => out.push_str(&self.format("%H:%M")?),
                Some('c') => out.push_str(&self.format("%a %b %e %H:%M:%S %Y")?),
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('%') => out.push('%'),
                Some(other) => return Err(format!("strftime_now: unsupported directive %{other}")),
                None => return Err("strftime_now: format ends with a lone %".into()),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values from GNU `date -u -d @SECS +FORMAT`.
    #[test]
    fn formats_like_gnu_date() {
        // 2024-07-26T13:05:09Z, a Friday, day 208 of a leap year.
        let t = CivilTime::from_unix(1_721_999_109, 0);
        assert_eq!(t.format("%d %b %Y").unwrap(), "26 Jul 2024");
        assert_eq!(
            t.format("%A %B %-d, %I:%M %p %j %w").unwrap(),
            "Friday July 26, 01:05 PM 208 5"
        );
        assert_eq!(
            t.format("%c|%x|%F").unwrap(),
            "Fri Jul 26 13:05:09 2024|07/26/24|2024-07-26"
        );
        // 2000-02-29 and 1969-12-31T23:59:59Z (negative seconds).
        assert_eq!(
            CivilTime::from_unix(951_782_400, 0)
                .format("%F %a %j")
                .unwrap(),
            "2000-02-29 Tue 060"
        );
        assert_eq!(
            CivilTime::from_unix(-1, 0).format("%F %T %a").unwrap(),
            "1969-12-31 23:59:59 Wed"
        );
        assert!(t.format("%Q").unwrap_err().contains("%Q"));
    }
}
