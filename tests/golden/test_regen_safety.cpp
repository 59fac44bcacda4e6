// Golden files are edited by hand and rewritten by regen: what regen must refuse (a duplicated key, a symbolic link,
// something that is not a regular file, a read-only file), and that it writes the set all or nothing, never leaving
// a torn file or a stray temporary behind, even when killed at any step (issue 13, items 5 and 8).
#include "kvcheck/golden/golden.hpp"
#include "kvcheck/golden/oracle.hpp"

#include "golden_test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <map>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace kvc::golden;
using golden_test::golden_dir;
using golden_test::read;
using golden_test::ScratchDir;
using nlohmann::json;

namespace fs = std::filesystem;

const std::string kFile = "000_7a0753d5dc4e224c.json";

const Oracle& oracle() {
    static const Oracle o;
    return o;
}

// The committed file with a second "computed" member inserted into its first entry, before the real one.
std::string with_duplicate_key() {
    std::string text = read(golden_dir() / kFile);
    const size_t at = text.find("\"computed\": ");
    EXPECT_NE(at, std::string::npos);
    return text.insert(at, "\"computed\": 12345.0,\n      ");
}

// A stale but well-formed version of a golden file: every computed field removed (regen fills them back in).
std::string stale(const fs::path& file) {
    json doc = json::parse(read(file));
    for (auto& e : doc["entries"]) e.erase("computed");
    return doc.dump(1);
}

// Makes every file of the scratch set stale; returns {old text, the text regen must write} per file name.
std::map<std::string, std::pair<std::string, std::string>> make_all_stale(const fs::path& dir) {
    std::map<std::string, std::pair<std::string, std::string>> texts;
    for (const auto& f : golden_files(dir)) {
        const std::string old = stale(f);
        golden_test::write(f, old);
        texts[f.filename().string()] = {old, read(golden_dir() / f.filename())};
    }
    return texts;
}

std::vector<std::string> temporaries(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".tmp") out.push_back(e.path().filename().string());
    return out;
}

TEST(RegenSafety, ADuplicatedKeyIsMalformedForVerifyAndRegen) {
    const std::string text = with_duplicate_key();
    ASSERT_NO_THROW(json::parse(text)); // plain JSON parsing would keep one of the two values in silence
    const FileReport f = verify_text(kFile, text, oracle());
    EXPECT_NE(f.malformed.find("duplicate key \"computed\""), std::string::npos) << f.malformed;
    EXPECT_NE(f.malformed.find("/entries/0/computed"), std::string::npos) << f.malformed;
    EXPECT_THROW(regen_text(kFile, text, oracle()), FormatError);

    ScratchDir dir("dup-key");
    golden_test::write(dir.path() / kFile, text);
    std::string internal;
    const auto results = regen_dir(dir.path(), internal);
    ASSERT_EQ(results.size(), 4u);
    EXPECT_NE(results[0].error.find("duplicate key"), std::string::npos) << results[0].error;
    EXPECT_EQ(read(dir.path() / kFile), text);
}

TEST(RegenSafety, DuplicateKeysAreFoundAtAnyDepthAndEqualKeysInSiblingsAreFine) {
    EXPECT_NE(verify_text(kFile, R"({"a": 1, "a": 2})", oracle()).malformed.find("duplicate key \"a\""),
              std::string::npos);
    const std::string nested = R"({"x": [{"k": 1}, {"k": 2, "k": 3}]})";
    EXPECT_NE(verify_text(kFile, nested, oracle()).malformed.find("/x/1/k"), std::string::npos)
        << verify_text(kFile, nested, oracle()).malformed;
    // same key in two different objects: not a duplicate (the file is still malformed: no schema fields)
    EXPECT_EQ(verify_text(kFile, R"({"x": [{"k": 1}, {"k": 2}]})", oracle()).malformed.find("duplicate"),
              std::string::npos);
}

TEST(RegenSafety, ASymbolicLinkIsRefusedAndTheSetIsLeftAsItWas) {
    ScratchDir dir("symlink");
    const auto texts = make_all_stale(dir.path());
    ScratchDir outside("symlink-target");
    const fs::path target = outside.path() / "elsewhere.json";
    golden_test::write(target, texts.at(kFile).first);
    fs::remove(dir.path() / kFile);
    fs::create_symlink(target, dir.path() / kFile);

    std::string internal;
    const auto results = regen_dir(dir.path(), internal);
    ASSERT_EQ(results.size(), 4u);
    EXPECT_NE(results[0].error.find("symbolic link"), std::string::npos) << results[0].error;
    EXPECT_TRUE(fs::is_symlink(dir.path() / kFile));
    EXPECT_EQ(read(target), texts.at(kFile).first);
    for (const auto& [name, text] : texts)
        if (name != kFile) {
            EXPECT_EQ(read(dir.path() / name), text.first) << name << " was written";
        }
    EXPECT_TRUE(temporaries(dir.path()).empty());
}

TEST(RegenSafety, AReadOnlyFileIsRefusedEvenForRoot) {
    ScratchDir dir("read-only");
    const auto texts = make_all_stale(dir.path());
    const fs::path file = dir.path() / kFile;
    fs::permissions(file, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
    std::string internal;
    const auto results = regen_dir(dir.path(), internal);
    ASSERT_EQ(results.size(), 4u);
    EXPECT_NE(results[0].error.find("read-only"), std::string::npos) << results[0].error;
    EXPECT_EQ(read(file), texts.at(kFile).first);
    EXPECT_EQ(fs::status(file).permissions() & fs::perms::owner_write, fs::perms::none);
    for (const auto& r : results) EXPECT_FALSE(r.written) << r.file;
}

TEST(RegenSafety, AFifoNamedLikeAGoldenFileIsReportedNotSkippedAndNeverBlocks) {
    ScratchDir dir("fifo");
    const fs::path fifo = dir.path() / "004_fifo.json";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
    const Report r = verify_dir(dir.path()); // would block forever if it opened the FIFO for a blocking read
    EXPECT_EQ(r.exit_code(), 2);
    ASSERT_EQ(r.files.size(), 5u);
    EXPECT_NE(r.files[4].malformed.find("not a regular file"), std::string::npos) << r.files[4].malformed;
    std::string internal;
    const auto results = regen_dir(dir.path(), internal);
    ASSERT_EQ(results.size(), 5u);
    EXPECT_NE(results[4].error.find("not a regular file"), std::string::npos) << results[4].error;
    EXPECT_TRUE(fs::is_fifo(fifo));
}

TEST(RegenSafety, OneMalformedFileMeansNothingIsWritten) {
    ScratchDir dir("all-or-nothing");
    const auto texts = make_all_stale(dir.path());
    golden_test::write(dir.path() / "003_4a16429f040b344d.json", "{ truncated");
    std::string internal;
    const auto results = regen_dir(dir.path(), internal);
    ASSERT_EQ(results.size(), 4u);
    EXPECT_FALSE(results[3].error.empty());
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(results[i].changed) << results[i].file;
        EXPECT_FALSE(results[i].written) << results[i].file;
        EXPECT_EQ(read(dir.path() / results[i].file), texts.at(results[i].file).first) << results[i].file;
    }
}

bool has_journal(const fs::path& dir) { return fs::exists(fs::symlink_status(dir / ".regen-journal")); }

// regen SIGKILLed at every step of its write (test hook KVCHECK_TEST_REGEN_KILL_AT, golden/src/files.cpp): each file
// is always its complete old or complete new text; before the commit point (the journal) the set stays all old,
// after it verify refuses the part-renamed set and finishing it (the start of the next regen) makes it all new; no
// temporary and no journal is left afterwards.
TEST(RegenSafety, KilledAtAnyStepTheSetIsAllOldOrAllNewAndNoTemporaryIsLeft) {
    const int kFiles = 4;
    const int kSteps = kFiles /*temporaries*/ + 1 /*fsync, journal*/ + kFiles /*renames*/ + 1 /*fsync*/ + 1 /*unlink*/;
    const int kCommitted = kFiles + 1; // killed at this step or later: the journal is in place
    for (int step = 0; step <= kSteps; ++step) {
        SCOPED_TRACE("killed at step " + std::to_string(step));
        ScratchDir dir("killed");
        const auto texts = make_all_stale(dir.path());
        ASSERT_EQ(texts.size(), static_cast<size_t>(kFiles));
        const pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            ::setenv("KVCHECK_TEST_REGEN_KILL_AT", std::to_string(step).c_str(), 1);
            std::string internal;
            const auto results = regen_dir(dir.path(), internal);
            bool ok = internal.empty();
            for (const auto& r : results) ok = ok && r.error.empty() && r.written;
            ::_exit(ok ? 0 : 1);
        }
        int status = 0;
        ASSERT_EQ(::waitpid(pid, &status, 0), pid);
        if (step < kSteps) {
            ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
        } else {
            ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
        }
        const bool committed = step >= kCommitted && step < kSteps;
        const int renamed = std::max(0, std::min(kFiles, step - kCommitted)); // steps 5..8 rename files 0..3
        int fresh = 0;
        for (const auto& [name, text] : texts) {
            const std::string now = read(dir.path() / name);
            EXPECT_TRUE(now == text.first || now == text.second) << name << " is torn";
            fresh += now == text.second;
        }
        EXPECT_EQ(fresh, renamed);
        EXPECT_EQ(has_journal(dir.path()), committed);
        const Report report = verify_dir(dir.path());
        if (committed) {
            EXPECT_EQ(report.exit_code(), 2);
            EXPECT_NE(report.error.find("interrupted golden regen"), std::string::npos) << report.error;
        } else {
            EXPECT_EQ(report.exit_code(), step == kSteps ? 0 : 2); // the complete new set, or the stale old one
        }

        // What the next regen does first: afterwards the set is entirely old (killed before the commit point) or
        // entirely new (after it), with no temporary and no journal.
        const auto finished = finish_interrupted_regen(dir.path());
        EXPECT_EQ(finished.size(), committed ? static_cast<size_t>(kFiles - renamed) : 0u);
        const bool all_new = step >= kCommitted;
        for (const auto& [name, text] : texts)
            EXPECT_EQ(read(dir.path() / name), all_new ? text.second : text.first) << name;
        EXPECT_TRUE(temporaries(dir.path()).empty());
        EXPECT_FALSE(has_journal(dir.path()));
        EXPECT_EQ(verify_dir(dir.path()).exit_code(), all_new ? 0 : 2);

        std::string internal;
        for (const auto& r : regen_dir(dir.path(), internal)) EXPECT_TRUE(r.error.empty()) << r.file << r.error;
        EXPECT_TRUE(internal.empty()) << internal;
        EXPECT_TRUE(temporaries(dir.path()).empty());
        for (const auto& [name, text] : texts) EXPECT_EQ(read(dir.path() / name), text.second) << name;
    }
}

// A journal that cannot be trusted is never acted on: regen refuses with what to do by hand, verify refuses too,
// and nothing outside the directory is touched.
TEST(RegenSafety, AnEditedJournalIsRefusedNotFollowed) {
    ScratchDir dir("journal");
    const auto texts = make_all_stale(dir.path());
    for (const std::string& journal : {std::string("../outside.json\n"), std::string("000_7a0753d5dc4e224c.json"),
                                       std::string("nowhere.json\n")}) {
        SCOPED_TRACE(journal);
        golden_test::write(dir.path() / ".regen-journal", journal);
        try {
            finish_interrupted_regen(dir.path());
            ADD_FAILURE() << "an untrustworthy journal was acted on";
        } catch (const std::runtime_error& ex) {
            EXPECT_NE(std::string(ex.what()).find("by hand"), std::string::npos) << ex.what();
        }
        std::string internal;
        EXPECT_THROW(regen_dir(dir.path(), internal), std::runtime_error);
        EXPECT_EQ(verify_dir(dir.path()).exit_code(), 2);
        for (const auto& [name, text] : texts) EXPECT_EQ(read(dir.path() / name), text.first) << name;
    }
}

} // namespace
