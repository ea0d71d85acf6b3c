#![no_std]
// The programs are in main.rs. This library target exists only so that
// profiler-user can name the crate as a build dependency (aya-template's
// arrangement); it uses none of the dependencies.
#![allow(unused_crate_dependencies)]
