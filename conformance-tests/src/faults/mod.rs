//! Fault injection: a TCP proxy, a fenced resource, a history checker and
//! the scenarios that use them.
