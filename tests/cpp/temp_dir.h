// TempDir: a scratch directory for a test, removed with everything in it when the test ends.
#ifndef APEXRL_TESTS_CPP_TEMP_DIR_H_
#define APEXRL_TESTS_CPP_TEMP_DIR_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>

namespace apexrl::testing_util {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = ::testing::TempDir() + prefix + "_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string Path(const std::string& name) const { return path_ + "/" + name; }
  // Names of the files in the directory now.
  std::set<std::string> Files() const {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) names.insert(e.path().filename().string());
    return names;
  }

 private:
  std::string path_;
};

}  // namespace apexrl::testing_util

#endif  // APEXRL_TESTS_CPP_TEMP_DIR_H_
