//! sloserve api
