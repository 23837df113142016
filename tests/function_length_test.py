#!/usr/bin/env python3
"""Checks tests/function_length.py's scan on small C++ sources (run by tests/run_all.sh)."""
import pathlib
import sys
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import function_length as fl  # noqa: E402


def scan(src):
    return [(name, lines) for name, _, lines in fl.functions(fl.strip_code(src))]


class FunctionLengthTest(unittest.TestCase):
    def test_counts_code_lines_only(self):
        body = "\n".join(["  x++;"] * 3 + ["", "  // a comment", "  /* block", "  */"])
        self.assertEqual(scan("int F() {\n" + body + "\n}\n"), [("F", 3)])

    def test_braces_in_literals_and_comments_do_not_count(self):
        src = 'void F() {\n  s = "}{";\n  c = \'}\';\n  r = R"x(})x";\n  // }\n}\nvoid G() {\n}\n'
        self.assertEqual(scan(src), [("F", 3), ("G", 0)])

    def test_enters_namespaces_and_classes_and_skips_initializers(self):
        src = ("namespace a {\nnamespace {\nconst int k[] = {1,\n 2};\nenum class E {\n A,\n};\n"
               "class C : public B {\n public:\n  C(int v) : v_(v), w_{v} {\n    f();\n  }\n"
               "  int Get() const override {\n    return v_;\n  }\n  int v_, w_;\n};\n}\n"
               "void C::Run(int x) noexcept {\n  auto l = [&]() {\n    g();\n  };\n}\n}\n"
               "#define M(x) { x }\n")
        self.assertEqual(scan(src), [("C", 1), ("Get", 1), ("C::Run", 3)])

    def test_long_function_is_reported(self):
        src = "void Long() {\n" + "  x++;\n" * (fl.MAX_BODY_LINES + 1) + "}\n"
        self.assertEqual(scan(src), [("Long", fl.MAX_BODY_LINES + 1)])


if __name__ == "__main__":
    unittest.main()
