//! llama-bench's integer list syntax: `0,10,99`, `0-40+10` (step),
//! `1-64*2` (multiply), and an option given several times.

use anyhow::Result;

use crate::error::bad;

/// Parses one list argument into values in the order given.
///
/// # Errors
/// `BadInput` naming the item and the accepted syntax.
pub fn parse_list(arg: &str, what: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for item in arg.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(bad(format!(
                "{what} '{arg}' has an empty item; use a list like 0,10,99 or a range like 0-40+10"
            )));
        }
        out.extend(parse_item(item, what)?);
    }
    Ok(out)
}

fn num(s: &str, item: &str, what: &str) -> Result<u32> {
    s.parse::<u32>().map_err(|_| {
        bad(format!(
            "{what} '{item}' is not a number or range; use a list like 0,10,99 or a range like 0-40+10 (99 means all layers)"
        ))
    })
}

fn parse_item(item: &str, what: &str) -> Result<Vec<u32>> {
    let Some((first, rest)) = item.split_once('-') else {
        return Ok(vec![num(item, item, what)?]);
    };
    let first = num(first, item, what)?;
    let (last, op) = if let Some((l, s)) = rest.split_once('+') {
        (l, Some(('+', s)))
    } else if let Some((l, m)) = rest.split_once('*') {
        (l, Some(('*', m)))
    } else {
        (rest, None)
    };
    if last.is_empty() {
        return Err(bad(format!("{what} range '{item}' has no end; write first-last, e.g. 0-40 or 0-40+10")));
    }
    let last = num(last, item, what)?;
    if last < first {
        return Err(bad(format!("{what} range '{item}' ends before it starts; write first-last with first <= last")));
    }
    let mut v = Vec::new();
    match op {
        None => v.extend(first..=last),
        Some(('+', s)) => {
            let step = num(s, item, what)?;
            if step == 0 {
                return Err(bad(format!("{what} range '{item}' has step 0; use a step of 1 or more")));
            }
            v.extend((first..=last).step_by(step as usize));
        }
        Some((_, m)) => {
            let mult = num(m, item, what)?;
            if mult < 2 || first == 0 {
                return Err(bad(format!(
                    "{what} range '{item}' never grows; a *mult range needs first >= 1 and mult >= 2"
                )));
            }
            let mut x = first;
            while x <= last {
                v.push(x);
                x = x.saturating_mul(mult);
            }
        }
    }
    Ok(v)
}

/// Parses every occurrence of a list option and concatenates them.
///
/// # Errors
/// As [`parse_list`].
pub fn parse_all(args: &[String], what: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for a in args {
        out.extend(parse_list(a, what)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BadInput;

    fn err(s: &str) -> String {
        let e = parse_list(s, "--n-gpu-layers").unwrap_err();
        assert!(e.downcast_ref::<BadInput>().is_some());
        e.to_string()
    }

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse_list("0,10,99", "x").unwrap(), vec![0, 10, 99]);
        assert_eq!(parse_list("0-40+10", "x").unwrap(), vec![0, 10, 20, 30, 40]);
        assert_eq!(parse_list("0-35+10", "x").unwrap(), vec![0, 10, 20, 30]);
        assert_eq!(parse_list("1-3", "x").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_list("1-64*2", "x").unwrap(), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(parse_list("5", "x").unwrap(), vec![5]);
        assert_eq!(parse_all(&["0".into(), "8-9".into()], "x").unwrap(), vec![0, 8, 9]);
    }

    #[test]
    fn bad_ranges_name_the_item_and_the_fix() {
        assert!(err("10-").contains("'10-' has no end"));
        assert!(err("5-1").contains("ends before it starts"));
        assert!(err("a").contains("'a' is not a number"));
        assert!(err("0-10+0").contains("step 0"));
        assert!(err("0-10*2").contains("never grows"));
        assert!(err("1,,2").contains("empty item"));
        assert!(err("-1").contains("not a number"));
    }
}
