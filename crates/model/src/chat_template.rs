//! Chat template rendering (to come).
