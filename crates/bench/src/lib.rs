//! sloserve bench
