#!/usr/bin/env python3
"""Tests of tests/check_imports.py on small crates written to a temporary directory:
the circles it must report (through the crate root among them) and the layouts it must
accept (a root that re-exports its modules and defines items they use).

    python3 tests/check_imports_test.py
"""
import os, subprocess, sys, tempfile, unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'check_imports.py')


def check(files):
    """Runs the checker on a crate made of `files` (path under src/ -> text): its exit code
    and output."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, 'src')
        for path, text in files.items():
            p = os.path.join(src, path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, 'w') as f:
                f.write(text)
        run = subprocess.run([sys.executable, CHECKER, src], capture_output=True, text=True)
        return run.returncode, run.stdout.replace(src, 'src')


class CrateRoot(unittest.TestCase):
    def test_root_item_used_by_a_module_the_root_uses_is_a_circle(self):
        # lib.rs builds its table with registry::entry; registry reads the table.
        code, out = check({
            'lib.rs': 'mod registry;\nuse registry::entry;\n'
                      'pub static ALL: &[u8] = &[entry()];\n',
            'registry.rs': 'pub const fn entry() -> u8 { 1 }\n'
                           'pub fn count() -> usize { crate::ALL.len() }\n',
        })
        self.assertEqual(code, 1, out)
        self.assertIn('src: import circle between files: the crate root, registry', out)
        self.assertIn('the crate root -> registry  (lib.rs: `use registry::…`)', out)
        self.assertIn('registry -> the crate root  (registry.rs: `crate::ALL`)', out)
        self.assertIn('import circle between modules: the crate root, registry', out)

    def test_grouped_and_glob_imports_of_the_root_count(self):
        code, out = check({
            'lib.rs': 'mod a;\nuse a::f;\npub struct Id;\npub fn g() { f() }\n',
            'a.rs': 'use crate::{Id};\npub fn f() {}\n',
        })
        self.assertEqual(code, 1, out)
        self.assertIn('a -> the crate root  (a.rs: `crate::{Id}`)', out)
        code, out = check({
            'lib.rs': 'mod a;\npub struct Id;\npub fn g() { a::f() }\nuse a::f as h;\n',
            'a.rs': 'use super::*;\npub fn f() {}\n',
        })
        self.assertEqual(code, 1, out)
        self.assertIn('a -> the crate root  (a.rs: `use super::*`)', out)

    def test_through_a_folder_module(self):
        # The root uses strategies::*, a strategy's file names the root's item: a circle
        # between the root and the top-level module `strategies`.
        code, out = check({
            'lib.rs': 'mod strategies;\nuse strategies::*;\n'
                      'pub static ALL: &[fn()] = &[one::run];\n',
            'strategies/mod.rs': 'pub mod one;\n',
            'strategies/one.rs': 'pub fn run() { let _ = crate::ALL; }\n',
        })
        self.assertEqual(code, 1, out)
        self.assertIn('import circle between modules: the crate root, strategies', out)
        self.assertIn('strategies -> the crate root  (strategies::one: `crate::ALL`)', out)

    def test_a_facade_root_is_no_circle(self):
        # Re-exports, and an item of the root its modules use: the root uses none of them.
        code, out = check({
            'lib.rs': 'mod a;\nmod b;\npub use a::A;\npub use b::*;\npub type Id = usize;\n',
            'a.rs': 'pub struct A(pub crate::Id);\n',
            'b.rs': 'use crate::{Id, A};\npub struct B(pub Id, pub A);\n',
        })
        self.assertEqual((code, out), (0, ''))

    def test_a_reexport_the_root_uses_is_a_use(self):
        code, out = check({
            'lib.rs': 'mod a;\npub use a::A;\npub type Id = usize;\npub fn make() -> A { A(0) }\n',
            'a.rs': 'pub struct A(pub crate::Id);\n',
        })
        self.assertEqual(code, 1, out)
        self.assertIn('the crate root -> a  (lib.rs: `pub use a::A (and uses A)`)', out)

    def test_a_reexported_name_leads_to_its_module(self):
        # `crate::B` is b's item: a and b import each other through the root's re-exports.
        code, out = check({
            'lib.rs': 'mod a;\nmod b;\npub use a::A;\npub use b::B;\n',
            'a.rs': 'pub struct A;\npub fn f(_: crate::B) {}\n',
            'b.rs': 'pub struct B;\npub fn g(_: crate::A) {}\n',
        })
        self.assertEqual(code, 1, out)
        self.assertIn('import circle between files: a, b', out)
        self.assertNotIn('the crate root', out)


class Modules(unittest.TestCase):
    def test_two_modules_importing_each_other(self):
        code, out = check({
            'lib.rs': 'mod a;\nmod b;\n',
            'a.rs': 'use crate::b::Y;\npub struct X;\n',
            'b.rs': 'use crate::a::X;\npub struct Y;\n',
        })
        self.assertEqual(code, 1, out)
        self.assertIn('import circle between files: a, b', out)
        self.assertIn('a -> b  (a.rs: `crate::b::Y`)', out)
        self.assertIn('b -> a  (b.rs: `crate::a::X`)', out)

    def test_test_modules_may_use_anything(self):
        code, out = check({
            'lib.rs': 'mod a;\npub use a::f;\npub struct Id;\n#[cfg(test)]\nmod tests;\n',
            'a.rs': 'pub fn f() {}\n',
            'tests.rs': 'use crate::*;\nuse super::a::f;\n',
        })
        self.assertEqual((code, out), (0, ''))

    def test_a_binary_beside_the_library_is_another_crate(self):
        code, out = check({
            'lib.rs': 'mod a;\npub use a::f;\npub struct Id;\n',
            'a.rs': 'pub fn f(_: crate::Id) {}\n',
            'main.rs': 'fn main() { mylib::f(mylib::Id) }\n',
        })
        self.assertEqual((code, out), (0, ''))


if __name__ == '__main__':
    unittest.main()
