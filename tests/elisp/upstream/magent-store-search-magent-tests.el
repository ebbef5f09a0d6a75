;;; magent-store-search-magent-tests.el --- RET on a search result resumes the session in magent  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Sessions written through magent's own functions with `magent-store-mode'
;; on, found by the real `magent-store search' process, then opened with
;; RET: the session must come back through magent's own loader
;; (`magent-runtime-load-session-file', what magent's ACP session/load
;; runs), registered in magent's runtime under its scope, equal to what
;; magent's own save and read give for the same session.  Upstream
;; magent's code from MAGENT_LISP; its runtime needs yaml.el (Debian:
;; elpa-yaml): without it these tests are skipped loudly, and fail under
;; CI=true.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-upstream)
(require 'magent-store-resume-tests)
(require 'magent-store-search)

(defvar magent-runtime-api--sessions)

(declare-function magent-runtime-session-p "ext:magent-runtime-api" (object))
(declare-function magent-runtime-session-id "ext:magent-runtime-api" (session))
(declare-function magent-runtime-session-scope "ext:magent-runtime-api" (session))
(declare-function magent-runtime-session-magent-session "ext:magent-runtime-api"
                  (session))
(declare-function magent-runtime-session-from-id "ext:magent-runtime-api"
                  (session-id &optional scope))

(defun magent-store-search-magent-test--runtime ()
  "Load magent's runtime, or skip loudly (fail under CI) without yaml.el."
  (unless (magent-store-upstream-available-p)
    (ert-skip "MAGENT_LISP does not name upstream magent's lisp/ folder"))
  (magent-store-upstream-need (magent-store-upstream-load-runtime)
                              "yaml.el, which magent's runtime needs"
                              "apt-get install elpa-yaml"))

(defun magent-store-search-magent-test--search (query)
  "Search the store for QUERY as M-x magent-store-search does; return the buffer."
  (let ((buffer (magent-store-search query)))
    (with-timeout (60 (error "The search did not finish"))
      (while (buffer-local-value 'magent-store-search--process buffer)
        (accept-process-output nil 0.05)))
    buffer))

(defun magent-store-search-magent-test--ret (buffer id)
  "Press RET in BUFFER on the line of session ID; return what it returned."
  (with-current-buffer buffer
    (goto-char (point-min))
    (while (and (not (eobp))
                (not (equal (alist-get 'id (tabulated-list-get-id)) id)))
      (forward-line 1))
    (should (equal (alist-get 'id (tabulated-list-get-id)) id))
    (call-interactively (key-binding (kbd "RET")))))

(ert-deftest magent-store-search-ret-resumes-the-session-in-magent ()
  "RET on a result loads its session through magent's own loader, in its
scope, equal to magent's own save and read of the same session."
  (magent-store-search-magent-test--runtime)
  (magent-store-resume-test--with-magent
    (let* ((magent-runtime-api--sessions (make-hash-table :test #'equal))
           (project (file-truename (file-name-directory magent-session-directory)))
           (global (magent-store-resume-test--new-session "20261130-200000-g"))
           (in-project (magent-store-resume-test--new-session
                        "20261130-200000-p" project))
           (own (list (cons "20261130-200000-g"
                            (magent-store-resume-test--own-save global 'global))
                      (cons "20261130-200000-p"
                            (magent-store-resume-test--own-save in-project project)))))
      (should (memq #'magent-store--magent-resume
                    magent-store-search-resume-functions))
      (magent-store-resume-test--restart)
      (let ((buffer (magent-store-search-magent-test--search "CHUNK 3 QUOTED")))
        (should (equal (sort (mapcar (lambda (entry) (alist-get 'id (car entry)))
                                     (buffer-local-value 'tabulated-list-entries buffer))
                             #'string<)
                       '("20261130-200000-g" "20261130-200000-p")))
        (pcase-dolist (`(,id . ,own-file) own)
          (let* ((expected (magent-store-resume-test--own-read own-file))
                 ;; The scope as magent reads it back from its own file.
                 (scope (plist-get expected :scope))
                 (runtime (progn
                            (should-not (magent-runtime-session-from-id id scope))
                            (magent-store-search-magent-test--ret buffer id))))
            (should (equal scope (if (equal id "20261130-200000-g") 'global
                                   (directory-file-name project))))
            (should (magent-runtime-session-p runtime))
            (should (equal (magent-runtime-session-id runtime) id))
            (should (equal (magent-runtime-session-scope runtime) scope))
            ;; Registered in magent's runtime, and installed as its scope's session.
            (should (eq (magent-runtime-session-from-id id scope) runtime))
            (should (eq (magent-session-get-if-present scope)
                        (magent-runtime-session-magent-session runtime)))
            (should (equal (magent-store-resume-test--state
                            (magent-runtime-session-magent-session runtime))
                           (magent-store-resume-test--state
                            (plist-get expected :session))))
            (should (= 2 (length (magent-thread-turns
                                  (magent-session-thread-ledger
                                   (magent-runtime-session-magent-session
                                    runtime))))))))))))

(ert-deftest magent-store-search-ret-without-the-mode-shows-the-transcript ()
  "With the mode off, magent's loader is not offered the store's files
\(its release cannot read them without the mode): RET shows the transcript."
  (magent-store-search-magent-test--runtime)
  (magent-store-resume-test--with-magent
    (let ((magent-runtime-api--sessions (make-hash-table :test #'equal)))
      (magent-store-resume-test--new-session "20261130-200100-g")
      (magent-store-resume-test--restart)
      (magent-store-mode -1)
      (should-not (memq #'magent-store--magent-resume
                        magent-store-search-resume-functions))
      (let* ((buffer (magent-store-search-magent-test--search "chunk 4"))
             (view (magent-store-search-magent-test--ret buffer "20261130-200100-g")))
        (should (bufferp view))
        (with-timeout (60 (error "The transcript did not appear"))
          (while (with-current-buffer view
                   (string-prefix-p "Reading" (buffer-string)))
            (accept-process-output nil 0.05)))
        (should (string-match-p "chunk 4 \"quoted\"" (with-current-buffer view
                                                     (buffer-string))))
        (should (= 0 (hash-table-count magent-runtime-api--sessions)))))))

(provide 'magent-store-search-magent-tests)
;;; magent-store-search-magent-tests.el ends here
