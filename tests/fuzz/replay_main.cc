// Runs files through LLVMFuzzerTestOneInput without libFuzzer: every file of the seed corpus and
// of the regressions folder (crashes found by `make fuzz`, kept as regression tests), or of the
// folders/files named on the command line. Fails when it finds no input at all.
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
void Collect(const std::string& path, std::vector<std::string>* files) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return;
  if (S_ISREG(st.st_mode)) {
    files->push_back(path);
    return;
  }
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == ".." || name[0] == '.') continue;
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".md") == 0) continue;
    Collect(path + "/" + name, files);
  }
  closedir(d);
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> roots(argv + 1, argv + argc);
  if (roots.empty()) {
    const char* srcdir = std::getenv("TEST_SRCDIR");
    const std::string base = std::string(srcdir ? srcdir : ".") + "/offloadd/tests/fuzz/";
    roots = {base + "corpus", base + "regressions"};
  }
  std::vector<std::string> files;
  for (const auto& r : roots) Collect(r, &files);
  if (files.empty()) {
    std::fprintf(stderr, "no inputs found\n");
    return 1;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string bytes = ss.str();
    std::printf("%s (%zu bytes)\n", f.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%zu inputs replayed\n", files.size());
  return 0;
}
