//! sloserve server
