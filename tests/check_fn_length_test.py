#!/usr/bin/env python3
"""The function-length check finds a function one line too long, in code and not in tests,
and does not count braces inside strings or comments.

    python3 tests/check_fn_length_test.py
"""
import os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def fn(name, lines, body_line='    let _x = 1;'):
    # `fn` line + body + closing brace = lines in all.
    return '\n'.join([f'pub fn {name}() {{'] + [body_line] * (lines - 2) + ['}']) + '\n'


def check(files):
    with tempfile.TemporaryDirectory() as d:
        for rel, text in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, 'w') as f:
                f.write(text)
        r = subprocess.run([sys.executable, os.path.join(HERE, 'check_fn_length.py'), d],
                           capture_output=True, text=True)
        return r.returncode, r.stdout


def main():
    rc, out = check({'a/src/lib.rs': fn('fits', 100)})
    assert rc == 0, out
    rc, out = check({'a/src/lib.rs': fn('fits', 100) + fn('too_long', 101)})
    assert rc == 1 and 'fn too_long is 101 lines' in out and 'fits' not in out, out
    # Braces in strings and comments do not end the function early.
    rc, out = check({'a/src/lib.rs': fn('braces', 101, '    let _s = "}"; // }')})
    assert rc == 1 and 'fn braces is 101 lines' in out, out
    # Test code may be longer.
    rc, out = check({
        'a/src/lib.rs': '#[cfg(test)]\nmod tests {\n' + fn('long_test', 150) + '}\n',
        'a/src/tests.rs': fn('long_test', 150),
        'a/tests/it.rs': fn('long_test', 150),
    })
    assert rc == 0, out
    print('check_fn_length: 4 cases ok')


if __name__ == '__main__':
    main()
