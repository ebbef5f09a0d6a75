;;; magent-store-find-tests.el --- ERT tests for M-x magent-store-find-session  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Sessions are written through the shim to a real backend, in every
;; scope, and one in magent's own format beside them; the finder lists
;; them with the real `magent-store ls --brief' and asks the real
;; `magent-store search'.

;;; Code:

(require 'ert)
(require 'magent-store-test)
(require 'magent-store-find)
(require 'magent-store-search-tests)

(defun magent-store-find-test--write (session-id scope title text &optional age)
  "Write SESSION-ID under SCOPE titled TITLE, its reply TEXT, AGE seconds old."
  (magent-store-open session-id scope)
  (magent-store-test--start-turn session-id)
  (magent-store-append-item-content session-id "item-1" text)
  (magent-store-put-header session-id `((title . ,title)))
  (magent-store-flush session-id)
  (when age
    (let ((time (time-subtract (current-time) age)))
      (dolist (file (directory-files-recursively
                     magent-store-root (concat "\\`" (regexp-quote session-id) "\\.")))
        (set-file-times file time)))))

(defun magent-store-find-test--tree ()
  "Write the sessions of the tests: every scope, a shared title, schema 6."
  (let ((project (expand-file-name "src/shop" (file-name-directory
                                                (directory-file-name magent-store-root)))))
    (magent-store-find-test--write "g-new" 'global "Fix the parser" "quotes are dropped" 60)
    (magent-store-find-test--write "p-one" project "Fix the parser" "the flux capacitor hums" 7200)
    (magent-store-find-test--write "a-one" '(action . "review") "Review the diff 差分" "all good" 86400)
    (let ((old (magent-store-search-test--write-schema6 "old6" "an old reply")))
      (set-file-times old (time-subtract (current-time) (* 3 86400))))
    project))

(defun magent-store-find-test--table ()
  "Return (STATE . TABLE) of a finder over the test root."
  (magent-store-find-table magent-store-root))

(ert-deftest magent-store-find-candidates-are-every-session-newest-first ()
  "Every session under the root is a candidate, whatever its scope or
format, newest first; a title two sessions share is followed by each id."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (let ((table (cdr (magent-store-find-test--table))))
      (should (equal (funcall table "" nil t)
                     '("Fix the parser (g-new)" "Fix the parser (p-one)"
                       "Review the diff 差分" "An old session")))
      ;; Typing narrows as completion does.
      (should (equal (all-completions "Fix" table) '("Fix the parser (g-new)"
                                                      "Fix the parser (p-one)")))
      (should (eq (test-completion "Review the diff 差分" table) t))
      (should (equal (alist-get 'category (cdr (funcall table "" nil 'metadata)))
                     'magent-store-session)))))

(ert-deftest magent-store-find-annotations-name-project-age-and-size ()
  "Both the annotation and the affixation show where, how old and how big."
  (magent-store-test--with-backend
    (let* ((project (magent-store-find-test--tree))
           (table (cdr (magent-store-find-test--table)))
           (metadata (cdr (funcall table "" nil 'metadata)))
           (annotate (alist-get 'annotation-function metadata))
           (affix (alist-get 'affixation-function metadata))
           (size (apply #'+ (mapcar (lambda (f) (file-attribute-size (file-attributes f)))
                                    (directory-files-recursively
                                     magent-store-root "\\`p-one\\.\\(json\\|jsonl\\|snapshot\\)\\'")))))
      (let ((note (funcall annotate "Fix the parser (p-one)")))
        ;; The end of a long root: the project's own name.
        (should (string-match-p (regexp-quote (substring (abbreviate-file-name project) -20))
                                note))
        (should (string-match-p " 2h " note))
        (should (string-match-p (regexp-quote (file-size-human-readable size 'iec " ")) note))
        (should (eq (get-text-property 3 'face note) 'completions-annotations)))
      (should (string-match-p "global +1m " (funcall annotate "Fix the parser (g-new)")))
      (should (string-match-p "action review +1d " (funcall annotate "Review the diff 差分")))
      (should (string-match-p "3d .*schema 6" (funcall annotate "An old session")))
      (let ((affixed (funcall affix '("Review the diff 差分" "An old session"))))
        (should (equal (mapcar #'car affixed) '("Review the diff 差分" "An old session")))
        (pcase-dolist (`(,candidate ,prefix ,suffix) affixed)
          (should (equal prefix ""))
          (should (string-match-p (regexp-quote (string-trim (funcall annotate candidate)))
                                  suffix))
          ;; The annotations start in one column, past the longest title,
          ;; counted from the candidate's start: spaces, whatever the column.
          (should (= (+ (string-width candidate)
                        (- (length suffix) (length (string-trim-left suffix))))
                     (+ 2 (string-width "Review the diff 差分"))))
          (should-not (text-property-not-all 0 (length suffix) 'display nil suffix)))))))

(ert-deftest magent-store-find-annotations-are-aligned-in-every-column ()
  "In the default completion UI's columns, each session's annotation
starts past the longest title from where its title starts; in a one
column UI (vertico's), the same: never right after a title."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (let* ((table (cdr (magent-store-find-test--table)))
           (metadata (cdr (funcall table "" nil 'metadata)))
           (candidates (funcall table "" nil t))
           (longest (apply #'max (mapcar #'string-width candidates)))
           (affixed (funcall (alist-get 'affixation-function metadata) candidates)))
      (dolist (format '(horizontal vertical one-column))
        (with-temp-buffer
          ;; A wide window, as a terminal of 300 columns shows it: room for
          ;; two columns of sessions.
          (let ((completions-format format)
                (standard-output (current-buffer))
                (size (cons (frame-width) (frame-height)))
                (shown (window-buffer)))
            (set-frame-size (selected-frame) 300 (cdr size))
            (set-window-buffer (selected-window) (current-buffer))
            (unwind-protect (completion--insert-strings affixed)
              (set-window-buffer (selected-window) shown)
              (set-frame-size (selected-frame) (car size) (cdr size))))
          (ert-info ((format "completions-format %s" format))
            (let ((starts 0))
              (dolist (candidate candidates)
                (goto-char (point-min))
                (should (search-forward candidate nil t))
                (let* ((line (buffer-substring (line-beginning-position) (point)))
                       (title-column (- (string-width line) (string-width candidate)))
                       (note (progn (skip-chars-forward " ") (point))))
                  (should (eq (get-text-property note 'face) 'completions-annotations))
                  (should (= (- (string-width (buffer-substring (line-beginning-position) note))
                                title-column)
                             (+ 2 longest)))
                  (when (> title-column 0) (setq starts (1+ starts)))))
              ;; The default layout does put titles past the first column.
              (unless (eq format 'one-column)
                (should (> starts 0))))))))))

(ert-deftest magent-store-find-words-no-title-holds-ask-the-index ()
  "A word no title holds finds the sessions in which it was said."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (let* ((magent-store-find-search-timeout 60)
           (table (cdr (magent-store-find-test--table))))
      ;; "capacitor" is in p-one's reply, in no title.
      (should (equal (funcall table "flux capacitor" nil t) '("Fix the parser (p-one)")))
      (should (eq (test-completion "Fix the parser (p-one)" table) t))
      ;; Words a title holds narrow the titles, without the index.
      (should (equal (funcall table "Review" nil t) '("Review the diff 差分")))
      ;; The index's sessions survive completion styles that match titles only.
      (let ((completion-styles '(substring))
            (completion-category-overrides
             '((magent-store-session (styles magent-store-find)))))
        (should (equal (completion-all-completions "flux capacitor" table nil 14)
                       '("Fix the parser (p-one)" . 0)))
        (should (equal (car (completion-all-completions "diff" table nil 4))
                       "Review the diff 差分")))
      ;; Nothing said anywhere: no candidate.
      (should (null (funcall table "zorblaxian" nil t))))))

(ert-deftest magent-store-find-a-three-letter-word-asks-the-index ()
  "A word of three letters that no title holds is looked up in the index,
also in an interactive Emacs, where the wait gives way only to input."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (magent-store-find-test--write "z-three" 'global "Short words" "the zyx code")
    (clrhash magent-store-find--states)
    (let* ((magent-store-find-search-timeout 60)
           (table (cdr (magent-store-find-test--table)))
           (noninteractive nil))
      (should (equal (funcall table "zyx" nil t) '("Short words"))))))

(ert-deftest magent-store-find-a-new-list-is-what-words-are-looked-up-in ()
  "Whether a word is in a title is judged against the list shown now:
after the list is filled again, a word only the new list holds is in a
title, and a word only the old one held is not."
  (let ((state (magent-store-find--make-state :root "/r/")))
    (magent-store-find--fill state (list ["global/a.json" "a" "Fix the Parser" nil 1 1 7]))
    (should-not (magent-store-find--unmatched-p state "parser"))
    (should (magent-store-find--unmatched-p state "lexer"))
    (magent-store-find--fill state (list ["global/b.json" "b" "Tune the Lexer" nil 1 1 7]))
    (should-not (magent-store-find--unmatched-p state "LEXER"))
    (should (magent-store-find--unmatched-p state "parser"))
    (magent-store-find--fill state nil)
    (should (magent-store-find--unmatched-p state "lexer"))))

(ert-deftest magent-store-find-ages-turn-over-at-each-unit ()
  "An age is said in the next unit from the moment it reaches it: a minute
old is 1m, an hour 1h, a day 1d, sixty days 2mo, two years 2y."
  (let ((now 2000000000.0))
    (cl-letf (((symbol-function 'float-time) (lambda (&optional _time) now)))
      (dolist (case `((59 "now") (60 "1m") (3599 "59m") (3600 "1h") (86399 "23h")
                      (86400 "1d") (,(1- (* 86400 60)) "59d") (,(* 86400 60) "2mo")
                      (,(1- (* 86400 730)) "24mo") (,(* 86400 730) "2y")))
        (should (equal (list (car case) (magent-store-find--age (- now (car case))))
                       case))))))

(ert-deftest magent-store-find-a-project-root-of-32-characters-is-shown-whole ()
  "A project root fits its column up to 32 characters; a longer one keeps its end."
  (let ((fits (concat "/" (make-string 31 ?a)))
        (long (concat "/" (make-string 32 ?b))))
    (should (string-prefix-p (concat fits " ")
                             (magent-store-find--describe
                              (vector "x.json" "x" "T" (concat "project:" fits) nil nil 7))))
    (should (string-prefix-p (concat "…" (make-string 31 ?b) " ")
                             (magent-store-find--describe
                              (vector "x.json" "x" "T" (concat "project:" long) nil nil 7))))))

(ert-deftest magent-store-find-completion-answers-as-a-table-does ()
  "A whole candidate completes to itself, words the index found are not a
candidate themselves, and choosing nothing is an error that says so."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (clrhash magent-store-find--states)
    (let* ((magent-store-find-search-timeout 60)
           (table (cdr (magent-store-find-test--table))))
      (should (equal (all-completions "Review the diff 差分" table) '("Review the diff 差分")))
      (should (equal (funcall table "flux capacitor" nil t) '("Fix the parser (p-one)")))
      (should-not (test-completion "flux capacitor" table))
      (let ((completing-read-function (lambda (&rest _) "")))
        (should (equal (should-error (magent-store-find-read-session "Session: ")
                                     :type 'user-error)
                       '(user-error "No session chosen")))))))

(ert-deftest magent-store-find-a-title-is-offered-on-one-line-trimmed ()
  "A title on several lines, holding a tab, or with blanks around it is
offered on one line without them; an empty title by the session's id."
  (magent-store-test--with-backend
    (cl-loop for (id title) in '(("t-lead" "  Leading blank")
                                 ("t-trail" "Trailing blank  ")
                                 ("t-lines" "Two\n\nlines")
                                 ("t-tab" "A\ttab")
                                 ("t-cr" "Carriage\r\nreturn")
                                 ("t-plain" "Plain title")
                                 ("t-empty" ""))
             do (magent-store-find-test--write id 'global title "some text"))
    (clrhash magent-store-find--states)
    (should (equal (sort (funcall (cdr (magent-store-find-test--table)) "" nil t) #'string<)
                   '("A tab" "Carriage return" "Leading blank" "Plain title"
                     "Trailing blank" "Two lines" "t-empty")))))

(ert-deftest magent-store-find-a-blank-title-is-offered-by-id ()
  "A session whose title is only blanks is offered under its id."
  (magent-store-test--with-backend
    (magent-store-find-test--write "b-blank" 'global "   " "nothing to see")
    (clrhash magent-store-find--states)
    (should (equal (funcall (cdr (magent-store-find-test--table)) "" nil t) '("b-blank")))))

(ert-deftest magent-store-find-style-completes-to-what-the-index-found ()
  "The finder's completion style completes a word no title holds to the one
session the index found it in; found in several, it keeps what was typed."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (magent-store-find-test--write "x-two" 'global "Another" "quotes again")
    (let* ((magent-store-find-search-timeout 60)
           (table (cdr (magent-store-find-test--table)))
           (completion-styles '(substring))
           (completion-category-overrides '((magent-store-session (styles magent-store-find)))))
      (should (equal (completion-try-completion "hums" table nil 4)
                     '("Fix the parser (p-one)" . 22)))
      (should (equal (completion-try-completion "quotes" table nil 6) '("quotes" . 6)))
      ;; A title is completed by the usual styles.
      (should (equal (completion-try-completion "Review" table nil 6)
                     '("Review the diff 差分" . 18))))))

(ert-deftest magent-store-find-without-a-backend-or-a-saved-list-lists-at-once ()
  "With no backend running and no list saved, the first finder lists the
root itself, at once, and shows every session."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (clrhash magent-store-find--states)
    (let ((root (file-name-as-directory magent-store-root))
          (magent-store-current-backend nil))
      (should-not (magent-store-find--saved root))
      (should (equal (funcall (cdr (magent-store-find-test--table)) "" nil t)
                     '("Fix the parser (g-new)" "Fix the parser (p-one)"
                       "Review the diff 差分" "An old session"))))))

(ert-deftest magent-store-find-a-session-saved-since-the-list-is-found-and-taken ()
  "A session the list does not hold yet, found by the index, is a candidate
that completion accepts."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (let* ((magent-store-find-search-timeout 60)
           (table (cdr (magent-store-find-test--table))))
      (magent-store-find-test--write "g-late" 'global "Written later" "a zeppelin overhead")
      (should (equal (funcall table "zeppelin" nil t) '("Written later (g-late)")))
      (should (eq (test-completion "Written later (g-late)" table) t)))))

(defun magent-store-find-test--searches ()
  "Return the finder's search processes running now."
  (cl-remove-if-not (lambda (p) (and (process-live-p p)
                                     (string-prefix-p "magent-store-find-search"
                                                      (process-name p))))
                    (process-list)))

(ert-deftest magent-store-find-a-slow-search-gives-its-sessions-at-the-next-key ()
  "A search not done in time gives nothing now and its sessions later;
while it runs, another input starts no second search."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (let* ((magent-store-find-search-timeout 0)
           (table (cdr (magent-store-find-test--table))))
      (should (null (funcall table "flux capacitor" nil t)))
      (should (= (length (magent-store-find-test--searches)) 1))
      (should (null (funcall table "capacitor hums" nil t)))
      (should (= (length (magent-store-find-test--searches)) 1))
      (with-timeout (60 (error "The search did not finish"))
        (while (magent-store-find-test--searches)
          (accept-process-output nil 0.05)))
      (accept-process-output nil 0.1)
      (should (equal (funcall table "flux capacitor" nil t) '("Fix the parser (p-one)"))))))

(ert-deftest magent-store-find-shows-the-last-list-then-reads-it-again ()
  "A second finder shows the list the last one saved at once, and the new
session once the listing in the background is done."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (magent-store-find-test--table)
    (clrhash magent-store-find--states)
    (magent-store-find-test--write "g-newer" 'global "Brand new" "fresh")
    (let* ((state+table (magent-store-find-test--table))
           (table (cdr state+table)))
      (should-not (member "Brand new" (funcall table "" nil t)))
      (let ((process (gethash (file-name-as-directory magent-store-root)
                              magent-store-find--refreshing)))
        (should (processp process))
        (with-timeout (60 (error "The listing did not finish"))
          (while (gethash (file-name-as-directory magent-store-root)
                          magent-store-find--refreshing)
            (accept-process-output nil 0.05))))
      (should (equal (car (funcall table "" nil t)) "Brand new")))))

(ert-deftest magent-store-find-prepare-saves-the-list-the-first-finder-shows ()
  "Preparing lists the root in the background and reads nothing into this
Emacs; the first finder then shows that list without listing."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (clrhash magent-store-find--states)
    (let ((root (file-name-as-directory magent-store-root)))
      (should-not (magent-store-find--saved root))
      (magent-store-find-prepare root)
      (should (processp (gethash root magent-store-find--refreshing)))
      (with-timeout (60 (error "The listing did not finish"))
        (while (gethash root magent-store-find--refreshing)
          (accept-process-output nil 0.05)))
      (should-not (gethash root magent-store-find--states))
      (should (= (length (magent-store-find--saved root)) 4))
      (cl-letf (((symbol-function 'magent-store-find--list)
                 (lambda (&rest _) (error "Listed while the finder opened"))))
        (should (member "Review the diff 差分"
                        (funcall (cdr (magent-store-find-test--table)) "" nil t))))
      ;; Once this Emacs holds the list, preparing lists nothing.
      (with-timeout (60 (error "The listing did not finish"))
        (while (gethash root magent-store-find--refreshing)
          (accept-process-output nil 0.05)))
      (magent-store-find-prepare root)
      (should-not (gethash root magent-store-find--refreshing)))))

(ert-deftest magent-store-find-asks-a-running-backend-for-its-first-list ()
  "With a backend running and no list saved, the first finder's list is
the backend's answer: no listing of its own starts Python; the rows are
saved for the next Emacs as a listing saves them."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (clrhash magent-store-find--states)
    (let ((root (file-name-as-directory magent-store-root)))
      (should-not (magent-store-find--saved root))
      (should (magent-store-ready-p magent-store-current-backend))
      (cl-letf (((symbol-function 'magent-store-find--list)
                 (lambda (&rest _) (error "Listed apart while a backend runs"))))
        (should (equal (funcall (cdr (magent-store-find-test--table)) "" nil t)
                       '("Fix the parser (g-new)" "Fix the parser (p-one)"
                         "Review the diff 差分" "An old session"))))
      (should-not (gethash root magent-store-find--refreshing))
      (should (= (length (magent-store-find--saved root)) 4)))))

;; The backend's second answer for a root comes from its last listing at
;; once; the finder then lists again in the background and fills in what
;; changed since.
(ert-deftest magent-store-find-a-backends-last-listing-is-listed-again-behind ()
  "A backend that listed the root before answers with that listing, without
waiting to list again; the finder shows it and lists again in the
background, which brings in the session written since."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (clrhash magent-store-find--states)
    (let ((root (file-name-as-directory magent-store-root)))
      (should (= (length (funcall (cdr (magent-store-find-test--table)) "" nil t)) 4))
      (should-not (gethash root magent-store-find--refreshing))
      ;; A new Emacs's finder: nothing of the first list kept in Emacs.
      (clrhash magent-store-find--states)
      (delete-file (magent-store-find-test--rows-file root))
      (magent-store-find-test--write "g-late" 'global "Written since" "a late reply")
      (let ((table (cdr (magent-store-find-test--table))))
        (should-not (member "Written since" (funcall table "" nil t)))
        (should (gethash root magent-store-find--refreshing))
        (with-timeout (60 (error "The listing behind did not finish"))
          (while (gethash root magent-store-find--refreshing)
            (accept-process-output nil 0.05)))
        (should (member "Written since" (funcall table "" nil t)))))))

(defun magent-store-find-test--rows-file (root)
  "The file in which the last listing of ROOT saved its rows."
  (expand-file-name
   (format "brief-rows-%s.json"
           (secure-hash 'sha1 (encode-coding-string
                               (file-truename (directory-file-name root)) 'utf-8)))
   (magent-store-log-directory)))

(defun magent-store-find-test--prepare-timers ()
  "Return the idle timers that would prepare the finder's list."
  (cl-remove-if-not (lambda (timer)
                      (eq (timer--function timer) #'magent-store-magent--prepare-finder))
                    timer-idle-list))

(ert-deftest magent-store-find-the-mode-prepares-the-list-once-idle ()
  "Turning the mode on schedules one listing for when Emacs is idle, which
saves the rows the first finder shows; with the delay nil, none."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (clrhash magent-store-find--states)
    (let ((root (file-name-as-directory magent-store-root)))
      (unwind-protect
          (progn
            (let ((magent-store-find-prepare-delay nil))
              (magent-store-mode 1)
              (should-not (magent-store-find-test--prepare-timers))
              (magent-store-mode -1))
            (let ((magent-store-find-prepare-delay 30))
              (magent-store-mode 1)
              ;; Turned on again, or on while on: still one timer (each
              ;; pending timer costs Emacs at every wakeup).
              (magent-store-mode 1)
              (should (= (length (magent-store-find-test--prepare-timers)) 1))
              ;; Turned off, it is cancelled.
              (magent-store-mode -1)
              (should-not (magent-store-find-test--prepare-timers))
              (magent-store-mode 1)
              (let ((timers (magent-store-find-test--prepare-timers)))
                (should (= (length timers) 1))
                (should (= (float-time (timer--time (car timers))) 30))
                (cancel-timer (car timers))
                (funcall (timer--function (car timers)))))
            (with-timeout (60 (error "The listing did not finish"))
              (while (gethash root magent-store-find--refreshing)
                (accept-process-output nil 0.05)))
            (should (= (length (magent-store-find--saved root)) 4)))
        (mapc #'cancel-timer (magent-store-find-test--prepare-timers))
        (magent-store-mode -1)
        (should-not (magent-store-find-test--prepare-timers))))))

(ert-deftest magent-store-find-session-opens-the-picked-session ()
  "RET hands the picked session to `magent-store-search-open-function'."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (let* (opened
           (magent-store-search-open-function (lambda (hit) (setq opened hit)))
           (completing-read-function
            (lambda (_prompt table &rest _)
              (car (all-completions "Review" table)))))
      (magent-store-find-session magent-store-root)
      (should (equal (alist-get 'id opened) "a-one"))
      (should (equal (alist-get 'title opened) "Review the diff 差分"))
      (should (file-exists-p (alist-get 'header opened)))
      (should (string-match-p "/actions/[^/]+/a-one\\.json\\'" (alist-get 'header opened))))))

(ert-deftest magent-store-find-session-shows-the-transcript-by-default ()
  "Without an agent to resume it, the picked session is shown read-only."
  (magent-store-test--with-backend
    (magent-store-find-test--tree)
    (let* ((magent-store-search-resume-functions nil)
           (completing-read-function
            (lambda (_prompt table &rest _) (car (all-completions "Fix" table))))
           (view (magent-store-find-session magent-store-root)))
      (with-timeout (60 (error "The transcript did not appear"))
        (while (with-current-buffer view (string-prefix-p "Reading" (buffer-string)))
          (accept-process-output nil 0.05)))
      (with-current-buffer view
        (should buffer-read-only)
        (should (string-match-p "quotes are dropped" (buffer-string)))
        (should (string-match-p "g-new" (buffer-string)))))))

(ert-deftest magent-store-find-no-root-is-a-clear-error ()
  "A root that does not exist is named."
  (should-error (magent-store-find-table "/nonexistent/magent/root") :type 'user-error))

(provide 'magent-store-find-tests)
;;; magent-store-find-tests.el ends here
