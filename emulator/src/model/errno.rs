//! Linux errno values by name, as drivers and the control protocol carry them.

/// Errnos a profile may inject.
pub const INJECTABLE: [(&str, i32); 5] = [
    ("ENOSPC", libc::ENOSPC),
    ("EPERM", libc::EPERM),
    ("ENOMEM", libc::ENOMEM),
    ("EIO", libc::EIO),
    ("EBUSY", libc::EBUSY),
];

const OTHERS: [(&str, i32); 8] = [
    ("EEXIST", libc::EEXIST),
    ("ENOENT", libc::ENOENT),
    ("EINVAL", libc::EINVAL),
    ("EOPNOTSUPP", libc::EOPNOTSUPP),
    ("EPROTO", libc::EPROTO),
    ("ETIMEDOUT", libc::ETIMEDOUT),
    ("EPROTONOSUPPORT", libc::EPROTONOSUPPORT),
    ("EAGAIN", libc::EAGAIN),
];

/// Name of a (positive) errno, `E<n>` for ones not listed.
pub fn name(errno: i32) -> std::borrow::Cow<'static, str> {
    INJECTABLE
        .iter()
        .chain(OTHERS.iter())
        .find(|(_, v)| *v == errno)
        .map(|(n, _)| std::borrow::Cow::Borrowed(*n))
        .unwrap_or_else(|| std::borrow::Cow::Owned(format!("E{errno}")))
}

pub fn from_name(name: &str) -> Option<i32> {
    INJECTABLE.iter().chain(OTHERS.iter()).find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| *v)
}
